"""The verification gate: one transaction that consumes the intent and judges the response.

Checks in CONTRACT.md's order; the first that fails is the block reason. Every verify that
reaches the gate consumes the intent and counts one verification, cleared or blocked.
Atomicity is the database's: the conditional UPDATE consumes an intent at most once however many
workers race for it, the seen_responses primary key catches a replayed match_id, and the usage
upsert never passes the plan limit.
"""
import logging

from flask import current_app
from sqlalchemy import select, text, update

from app import crypto, metrics
from app.clock import billing_period, now_seconds
from app.extensions import db
from app.intents import idempotency
from app.intents.models import Intent, SeenResponse
from app.intents.reasons import (
    EXPIRED,
    INVALID_SIGNATURE,
    OUT_OF_WINDOW,
    REPLAYED_INTENT,
    REPLAYED_RESPONSE,
    UNKNOWN,
)
from app.intents.signature import canonical_json, matches, signing_message
from app.sql import upsert_insert
from app.tenants import metering
from app.tenants.plans import monthly_limit

log = logging.getLogger(__name__)


def result(cleared, reason, payload):
    return {"cleared": cleared, "reason": reason, "payload": payload if cleared else None}


def verify(principal, original_intent_hash, response, body, idempotency_key=None):
    """Return (verification result, replayed) for a validated verify request."""
    canonical_payload = canonical_json(response["payload"])
    metering.ensure_within_plan(principal)
    if idempotency_key is not None:
        earlier = idempotency.claim(principal.owner, idempotency_key, idempotency.body_digest(body))
        if earlier is not None:
            db.session.rollback()
            return result(earlier.cleared, earlier.reason, response["payload"]), True
    check = _Check(principal, original_intent_hash, response, canonical_payload)
    if db.session.get_bind().dialect.name == "postgresql":
        reason = _judge_in_one_statement(check)
    else:
        reason = _judge_step_by_step(check)
        metering.count_verification(principal)
    if idempotency_key is not None:
        idempotency.record_verdict(principal.owner, idempotency_key, reason is None, reason)
    db.session.commit()
    metrics.record_verdict(reason)
    log.info("verification", extra={"cleared": reason is None, "reason": reason})
    return result(reason is None, reason, response["payload"]), False


class _Check:
    """What the gate knows before touching the database. The signature needs no stored data,
    so it is computed up front; the checks still decide in CONTRACT.md's order."""

    def __init__(self, principal, intent_hash, response, canonical_payload):
        self.principal = principal
        self.intent_hash = intent_hash
        self.match_id = response["match_id"]
        self.timestamp = response["timestamp"]
        self.now = now_seconds()
        self.skew = current_app.config["CLOCK_SKEW_SECONDS"]
        message = signing_message(_scheme(principal), intent_hash, self.match_id, self.timestamp,
                                  canonical_payload)
        self.signature_ok = matches(_signing_secrets(principal, self.now), message,
                                    response["signature"])

    def in_window(self, issued_at):
        return issued_at - self.skew <= self.timestamp <= self.now + self.skew

    def may_clear(self, consumed):
        """Everything but the match_id replay check passes (mirrored in _VERIFY_SQL)."""
        return self.reason(consumed, first_sighting=True) is None

    def why_not_consumed(self, known_expires_at):
        """The intent was not ours to consume: unknown, expired (checked first) or used."""
        if known_expires_at is None:
            return UNKNOWN
        return EXPIRED if self.now > known_expires_at else REPLAYED_INTENT

    def reason(self, consumed, first_sighting):
        if self.now > consumed.expires_at:
            return EXPIRED
        if not self.signature_ok:
            return INVALID_SIGNATURE
        if not self.in_window(consumed.issued_at):
            return OUT_OF_WINDOW
        return None if first_sighting else REPLAYED_RESPONSE


def _judge_step_by_step(check):
    """Portable path (SQLite): one statement per step, in the request's transaction."""
    intents = Intent.__table__
    consumed = db.session.execute(
        update(intents)
        .where(intents.c.intent_hash == check.intent_hash, intents.c.owner == check.principal.owner,
               intents.c.consumed_at.is_(None))
        .values(consumed_at=check.now)
        .returning(intents.c.id, intents.c.issued_at, intents.c.expires_at)
    ).first()
    if consumed is None:
        return check.why_not_consumed(db.session.execute(
            select(intents.c.expires_at).where(intents.c.intent_hash == check.intent_hash,
                                               intents.c.owner == check.principal.owner)
        ).scalar())
    first_sighting = check.may_clear(consumed) and db.session.execute(
        upsert_insert(SeenResponse.__table__)
        .values(owner=check.principal.owner, match_id=check.match_id, intent_id=consumed.id)
        .on_conflict_do_nothing()
    ).rowcount == 1
    return check.reason(consumed, first_sighting)


# PostgreSQL: count the verification, consume the intent, and record the match_id when every
# other check passed, in one statement. The intent is consumed only if the count went in, so a
# verify refused at the plan limit changes nothing even without a rollback; that lets a verify
# without an Idempotency-Key run as a single self-committing statement (see single_statement).
_VERIFY_SQL = """
WITH {usage_cte}consumed AS (
    UPDATE intents SET consumed_at = :now
    WHERE intent_hash = :intent_hash AND owner = :owner AND consumed_at IS NULL{counted}
    RETURNING id, issued_at, expires_at
), sighting AS (
    INSERT INTO seen_responses (owner, match_id, intent_id)
    SELECT :owner, :match_id, id FROM consumed
    WHERE :signature_ok AND :now <= expires_at
      AND :timestamp BETWEEN issued_at - :skew AND :now + :skew
    ON CONFLICT DO NOTHING
    RETURNING intent_id
)
SELECT consumed.id, consumed.issued_at, consumed.expires_at,
       EXISTS (SELECT 1 FROM sighting) AS first_sighting,
       -- the statement's snapshot predates the UPDATE: this is NULL only for an unknown intent
       (SELECT expires_at FROM intents WHERE intent_hash = :intent_hash AND owner = :owner)
           AS known_expires_at{usage_column}
FROM (SELECT 1) AS one LEFT JOIN consumed ON true
"""
_USAGE_CTE = """usage AS (
    INSERT INTO monthly_usage (tenant_id, period, usage_count) VALUES (:tenant_id, :period, 1)
    ON CONFLICT (tenant_id, period) DO UPDATE SET usage_count = monthly_usage.usage_count + 1
    WHERE CAST(:plan_limit AS BIGINT) IS NULL OR monthly_usage.usage_count < :plan_limit
    RETURNING usage_count
), """
_METERED_SQL = text(_VERIFY_SQL.format(
    usage_cte=_USAGE_CTE, counted=" AND EXISTS (SELECT 1 FROM usage)",
    usage_column=",\n       (SELECT usage_count FROM usage) AS usage_count"))
_UNMETERED_SQL = text(_VERIFY_SQL.format(usage_cte="", counted="", usage_column=""))


def _judge_in_one_statement(check):
    principal = check.principal
    params = {"now": check.now, "intent_hash": check.intent_hash, "owner": principal.owner,
              "match_id": check.match_id, "signature_ok": check.signature_ok,
              "timestamp": check.timestamp, "skew": check.skew}
    metered = principal.kind == "tenant"
    if metered:
        params.update(tenant_id=principal.id, period=billing_period(),
                      plan_limit=monthly_limit(principal.tenant.plan))
    row = db.session.connection().execute(_METERED_SQL if metered else _UNMETERED_SQL, params).one()
    if metered and row.usage_count is None:
        metering.refuse_over_limit()
    if row.id is None:
        return check.why_not_consumed(row.known_expires_at)
    return check.reason(row, row.first_sighting)


def _scheme(principal):
    return principal.account.signature_scheme if principal.kind == "tenant" else "bound"


def _signing_secrets(principal, now):
    account = principal.account
    secrets = [crypto.unseal(account.signing_secret_sealed)]
    previous = getattr(account, "previous_signing_secret_sealed", None)
    if previous and (account.previous_signing_secret_expires_at or 0) >= now:
        secrets.append(crypto.unseal(previous))
    return secrets
