"""Idempotent retries of verify: one execution per (owner, Idempotency-Key) within 24 h.

The key is claimed by inserting its row first in the verify transaction. A concurrent retry's
INSERT waits on that row until the first transaction ends, then sees the stored verdict: so one
execution, whatever the timing. Only a digest of the body and the verdict are kept.
"""
import hashlib

from flask import request
from sqlalchemy import select, update

from app.clock import now_seconds
from app.errors import BadRequest, Unprocessable
from app.extensions import db
from app.intents.models import IdempotencyRecord
from app.intents.signature import canonical_json
from app.sql import upsert_insert

HEADER = "Idempotency-Key"
WINDOW_SECONDS = 24 * 3600


def key_from_request():
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= 255 or not key.isprintable() or not key.isascii():
        raise BadRequest("Idempotency-Key must be 1 to 255 printable ASCII characters")
    return key


def body_digest(body):
    return hashlib.sha256(canonical_json(body, field="request body")).hexdigest()


def claim(owner, key, digest):
    """Claim the key for this execution; return the earlier record if there is one."""
    now = now_seconds()
    inserted = db.session.execute(
        upsert_insert(IdempotencyRecord)
        .values(owner=owner, idempotency_key=key, body_digest=digest, created_at=now)
        .on_conflict_do_nothing()
    ).rowcount
    if inserted:
        return None
    record = db.session.execute(
        select(IdempotencyRecord).where(IdempotencyRecord.owner == owner,
                                        IdempotencyRecord.idempotency_key == key)
    ).scalar_one()
    if record.created_at < now - WINDOW_SECONDS:
        # Past its window: the key starts a new execution (purge removes such rows in bulk).
        taken = db.session.execute(
            update(IdempotencyRecord)
            .where(IdempotencyRecord.owner == owner, IdempotencyRecord.idempotency_key == key,
                   IdempotencyRecord.created_at == record.created_at)
            .values(body_digest=digest, created_at=now, cleared=None, reason=None)
        ).rowcount
        if taken:
            return None
        db.session.refresh(record)
    if record.body_digest != digest:
        raise Unprocessable("Idempotency-Key was already used with a different request body")
    return record


def record_verdict(owner, key, cleared, reason):
    db.session.execute(
        update(IdempotencyRecord)
        .where(IdempotencyRecord.owner == owner, IdempotencyRecord.idempotency_key == key)
        .values(cleared=cleared, reason=reason)
    )
