"""Idempotent retries of verify: one execution per (owner, Idempotency-Key) within 24 h.

The key is claimed by inserting its row first in the verify transaction. A concurrent retry's
INSERT waits on that row until the first transaction ends, then sees the stored verdict: so one
execution, whatever the timing. Only a digest of the body and the verdict are kept.
"""
import hashlib

from flask import request
from sqlalchemy import bindparam, select, update

from app import database
from app.clock import now_seconds
from app.errors import BadRequest, Unprocessable
from app.intents.models import IdempotencyRecord
from app.intents.signature import canonical_json

HEADER = "Idempotency-Key"
WINDOW_SECONDS = 24 * 3600
# The OpenAPI description of the header, and of the answer's mark on a replay.
PARAMETER = {"name": HEADER, "in": "header", "required": False,
             "description": "Retries with the same key and body within 24 h replay the verdict.",
             "schema": {"type": "string", "minLength": 1, "maxLength": 255,
                        # printable ASCII but the comma (see key_from_request)
                        "pattern": "^[\\x20-\\x2b\\x2d-\\x7e]*$"}}
REPLAYED = {"Idempotent-Replayed": "true"}
RESPONSE_HEADERS = {"Idempotent-Replayed": {
    "description": "`true` when this verify result replays an earlier one.",
    "schema": {"type": "string", "enum": ["true"]}}}
_RECORDS = IdempotencyRecord.__table__


def key_from_request():
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= 255 or not key.isprintable() or not key.isascii():
        raise BadRequest("Idempotency-Key must be 1 to 255 printable ASCII characters")
    if "," in key:
        # Two Idempotency-Key header lines reach the app joined by a comma (RFC 9110 5.3):
        # taken as one key, a retry sending either one alone would be judged again.
        raise BadRequest("Idempotency-Key must be one value, without a comma (two "
                         "Idempotency-Key headers arrive joined by one)")
    return key


def body_digest(body):
    return hashlib.sha256(canonical_json(body, field="request body")).hexdigest()


def _this_record():
    return ((_RECORDS.c.owner == bindparam("owner"))
            & (_RECORDS.c.idempotency_key == bindparam("idempotency_key")))


def _insert_claim():
    return (database.current().insert(_RECORDS)
            .values(owner=bindparam("owner"), idempotency_key=bindparam("idempotency_key"),
                    body_digest=bindparam("body_digest"), created_at=bindparam("now"))
            .on_conflict_do_nothing().returning(_RECORDS.c.created_at))


def _read_record():
    return select(_RECORDS.c.body_digest, _RECORDS.c.cleared, _RECORDS.c.reason,
                  _RECORDS.c.created_at).where(_this_record())


def _renew_claim():
    # Past its window the key starts a new execution (purge removes such rows in bulk).
    return (update(_RECORDS).where(_this_record(), _RECORDS.c.created_at == bindparam("seen_at"))
            .values(body_digest=bindparam("body_digest"), created_at=bindparam("now"),
                    cleared=None, reason=None)
            .returning(_RECORDS.c.created_at))


def _record_verdict():
    return (update(_RECORDS).where(_this_record())
            .values(cleared=bindparam("cleared"), reason=bindparam("reason")))


def claim(owner, key, digest):
    """Claim the key for this execution (inside the verify transaction); return the earlier
    record (body_digest, cleared, reason) if there is one."""
    params = {"owner": owner, "idempotency_key": key, "body_digest": digest,
              "now": now_seconds()}
    if database.first("idempotency_claim", _insert_claim, params) is not None:
        return None
    record = database.first("idempotency_read", _read_record, params)
    if record.created_at < params["now"] - WINDOW_SECONDS:
        params["seen_at"] = record.created_at
        if database.first("idempotency_renew", _renew_claim, params) is not None:
            return None
        record = database.first("idempotency_read", _read_record, params)
    if record.body_digest != digest:
        raise Unprocessable("Idempotency-Key was already used with a different request body")
    return record


def record_verdict(owner, key, reason):
    database.execute("idempotency_verdict", _record_verdict,
                     {"owner": owner, "idempotency_key": key, "cleared": reason is None,
                      "reason": reason})
