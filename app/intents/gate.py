"""The verification gate: one transaction that consumes the intent and judges the response.

Checks in CONTRACT.md's order; the first that fails is the block reason. Every verify that
reaches the gate consumes the intent and counts one verification, cleared or blocked.
Atomicity is the database's: the conditional UPDATE consumes an intent at most once however many
workers race for it, the seen_responses primary key catches a replayed match_id, and the usage
upsert never passes the plan limit.
"""
import logging

from flask import current_app
from sqlalchemy import select, update

from app import crypto, metrics
from app.clock import now_seconds
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
    reason = _judge(principal, original_intent_hash, response, canonical_payload)
    metering.count_verification(principal)
    if idempotency_key is not None:
        idempotency.record_verdict(principal.owner, idempotency_key, reason is None, reason)
    db.session.commit()
    metrics.record_verdict(reason)
    log.info("verification", extra={"cleared": reason is None, "reason": reason})
    return result(reason is None, reason, response["payload"]), False


def _judge(principal, intent_hash, response, canonical_payload):
    now = now_seconds()
    consumed = db.session.execute(
        update(Intent)
        .where(Intent.intent_hash == intent_hash, Intent.owner == principal.owner,
               Intent.consumed_at.is_(None))
        .values(consumed_at=now)
        .returning(Intent.id, Intent.issued_at, Intent.expires_at)
    ).first()
    if consumed is None:
        return _why_not_consumed(principal, intent_hash, now)
    if now > consumed.expires_at:
        return EXPIRED
    message = signing_message(_scheme(principal), intent_hash, response["match_id"],
                              response["timestamp"], canonical_payload)
    if not matches(_signing_secrets(principal, now), message, response["signature"]):
        return INVALID_SIGNATURE
    skew = current_app.config["CLOCK_SKEW_SECONDS"]
    if not consumed.issued_at - skew <= response["timestamp"] <= now + skew:
        return OUT_OF_WINDOW
    first_sighting = db.session.execute(
        upsert_insert(SeenResponse)
        .values(owner=principal.owner, match_id=response["match_id"], intent_id=consumed.id)
        .on_conflict_do_nothing()
    ).rowcount
    return None if first_sighting else REPLAYED_RESPONSE


def _why_not_consumed(principal, intent_hash, now):
    expires_at = db.session.execute(
        select(Intent.expires_at).where(Intent.intent_hash == intent_hash,
                                        Intent.owner == principal.owner)
    ).scalar()
    if expires_at is None:
        return UNKNOWN
    return EXPIRED if now > expires_at else REPLAYED_INTENT


def _scheme(principal):
    return principal.account.signature_scheme if principal.kind == "tenant" else "bound"


def _signing_secrets(principal, now):
    account = principal.account
    secrets = [crypto.unseal(account.signing_secret_sealed)]
    previous = getattr(account, "previous_signing_secret_sealed", None)
    if previous and (account.previous_signing_secret_expires_at or 0) >= now:
        secrets.append(crypto.unseal(previous))
    return secrets
