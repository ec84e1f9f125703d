"""The verification gate: consume the intent, count the verification, judge the response.

CONTRACT.md's checks are written once, in order, as SQL conditions (`_checks`); the first that
holds is the block reason. The steps are written once too, as SQLAlchemy Core statements:
count the verification (never past the plan), read the intent, consume it, record the match_id
when every other check passed, name the reason. PostgreSQL runs them as one statement of
data-modifying CTEs (one round trip, atomic, self-committing); SQLite runs the same steps in
sequence inside one BEGIN IMMEDIATE transaction. Atomicity is the database's: the conditional
UPDATE consumes an intent at most once however many workers race for it, the seen_responses key
catches a replayed match_id, and the usage upsert never passes the plan limit.

The intent's one write (consumed_at, and the match_id it records) touches no indexed column, so
PostgreSQL makes it a HOT update: no index entry, the least WAL (deploy/README: capacity).
"""
import json
import logging

from flask import current_app
from intentgate.signing import MAX_SAFE_INTEGER
from sqlalchemy import (String, and_, bindparam, case, exists, literal, not_, select, true,
                        update)

from app import crypto, database
from app.clock import billing_period, now_seconds, utc_day
from app.errors import Unavailable
from app.intents import reasons
from app.intents.models import Intent, SeenResponse
from app.intents.signature import canonical_json, ed25519_matches, matches, signing_message
from app.tenants import metering
from app.tenants.plans import monthly_limit
from app.webhooks import events

log = logging.getLogger(__name__)


def result(cleared, reason, payload):
    """The verdict as answered. A cleared payload comes back in the form that was signed, its
    JCS form (1.0 as 1, -0.0 as 0): never a value that differs from the signed one in type or
    sign, which a client comparing or re-signing it would see."""
    return {"cleared": cleared, "reason": reason,
            "payload": json.loads(canonical_json(payload), parse_int=_jcs_number) if cleared
            else None}


def _jcs_number(text):
    """JCS writes a whole double as digits: an integer within ±(2^53-1), a double beyond (it
    was one when signed, and stays one: 1e19 is not the integer 10000000000000000000)."""
    value = int(text)
    return value if abs(value) <= MAX_SAFE_INTEGER else float(text)


def verify(principal, original_intent_hash, response):
    """Judge a validated ScaleResponse; return the block reason, or None when cleared.
    Raises 429 when the tenant's plan is used up (then nothing was consumed or counted)."""
    now = now_seconds()
    params = {
        "now": now, "intent_hash": original_intent_hash, "owner": principal.owner,
        "match_id": response["match_id"],
        "signature_ok": _signature_ok(principal, original_intent_hash, response, now),
        "timestamp": response["timestamp"],  # within +/-(2**53 - 1): the schema says so
        "skew": current_app.config["CLOCK_SKEW_SECONDS"],
    }
    metered = principal.kind == "tenant"
    if metered:
        params.update(tenant_id=principal.id, period=billing_period(), day=utc_day(),
                      plan_limit=monthly_limit(principal.tenant.plan),
                      event_id=events.new_event_id())
    if database.current().composes_writes:
        return _in_one_statement(metered, params)
    return _step_by_step(metered, params)


def _checks(expires_at, issued_at, consumed_id, first_sighting):
    """CONTRACT.md's checks in order, as (reason, SQL condition that blocks)."""
    now, skew, timestamp = bindparam("now"), bindparam("skew"), bindparam("timestamp")
    return (
        (reasons.UNKNOWN, expires_at.is_(None)),
        (reasons.EXPIRED, now > expires_at),
        (reasons.REPLAYED_INTENT, consumed_id.is_(None)),
        (reasons.INVALID_SIGNATURE, not_(bindparam("signature_ok"))),
        (reasons.OUT_OF_WINDOW, not_(timestamp.between(issued_at - skew, now + skew))),
        (reasons.REPLAYED_RESPONSE, not_(first_sighting)),
    )


def _may_record(expires_at, issued_at, consumed_id):
    """The match_id is recorded only when every check before its own replay check passes."""
    checks = _checks(expires_at, issued_at, consumed_id, first_sighting=true())
    return and_(*(not_(blocks) for _, blocks in checks[:-1]))


def _reason(checks):
    return case(*((blocks, literal(reason)) for reason, blocks in checks)).label("reason")


# -- the steps --------------------------------------------------------------------------------

def _this_intent():
    intents = Intent.__table__
    return and_(intents.c.intent_hash == bindparam("intent_hash"),
                intents.c.owner == bindparam("owner"))


def _read_intent():
    intents = Intent.__table__
    return select(intents.c.issued_at, intents.c.expires_at).where(_this_intent())


def _consume():
    """Consume the intent and, when every check before the replay check passes (judged on the
    row itself), note the match_id on it: the purge finds its seen_responses row by it."""
    intents = Intent.__table__
    recorded = case((_may_record(intents.c.expires_at, intents.c.issued_at, intents.c.id),
                     bindparam("match_id")), else_=None)
    return (update(intents).where(_this_intent(), intents.c.consumed_at.is_(None))
            .values(consumed_at=bindparam("now"), match_id=recorded)
            .returning(intents.c.id, intents.c.match_id))


def _record_sighting(intent_id, match_id):
    """Record the consumed intent's match_id, if it noted one; a row back when it was new."""
    seen = SeenResponse.__table__
    sighting = select(bindparam("owner"), match_id, intent_id).where(match_id.is_not(None))
    return (database.current().insert(seen)
            .from_select([seen.c.owner, seen.c.match_id, seen.c.intent_id], sighting)
            .on_conflict_do_nothing().returning(seen.c.intent_id))


# -- PostgreSQL: the steps as one statement ---------------------------------------------------

def _composed(metered):
    known = _read_intent().cte("known")
    consume = _consume()
    columns = []
    if metered:
        counted = metering.count_statement().cte("counted")
        # Consumed only if counted: a verify refused at the plan limit changes nothing.
        consume = consume.where(exists(select(counted.c.usage_count)))
        columns.append(select(counted.c.usage_count).scalar_subquery().label("usage_count"))
    consumed = consume.cte("consumed")
    # The statement's snapshot predates the UPDATE: `known` reads the intent as it was.
    expires_at = select(known.c.expires_at).scalar_subquery()
    issued_at = select(known.c.issued_at).scalar_subquery()
    consumed_id = select(consumed.c.id).scalar_subquery()
    sighting = _record_sighting(consumed.c.id, consumed.c.match_id).cte("sighting")
    checks = _checks(expires_at, issued_at, consumed_id, exists(select(sighting.c.intent_id)))
    if not metered:
        return select(_reason(checks), *columns)
    verdict = select(_reason(checks)).cte("verdict")
    # The day's row by outcome, in the statement that counts the month: they always agree.
    daily = metering.count_daily_statement(verdict.c.reason, verdict,
                                           exists(select(counted.c.usage_count))).cte("daily")
    # usage.threshold, raised by the one verification whose count crosses a threshold.
    alerted = events.threshold_statement(counted).cte("alerted")
    return select(verdict.c.reason, *columns).add_cte(daily).add_cte(alerted)


# A tenant's verify, the hot path, is a function PostgreSQL plans once per connection; an admin
# key's (unmetered, rare) runs the statement itself.
VERIFY_FUNCTION = database.Function(
    "intentgate_verify", lambda: _composed(metered=True),
    arguments=[("now", "bigint"), ("intent_hash", "text"), ("owner", "text"),
               ("match_id", "text"), ("signature_ok", "boolean"), ("timestamp", "bigint"),
               ("skew", "bigint"), ("tenant_id", "integer"), ("period", "text"), ("day", "text"),
               ("plan_limit", "bigint"), ("event_id", "text")],
    returns=[("reason", "text"), ("usage_count", "bigint")],
)


def _in_one_statement(metered, params):
    if not metered:
        return database.first("gate_unmetered", lambda: _composed(metered=False), params).reason
    row = database.call(VERIFY_FUNCTION, params)
    if row.usage_count is None:
        metering.refuse_over_limit()
    return row.reason


# -- SQLite: the same steps in sequence, in one transaction -----------------------------------

def _stepped(build):
    """`build` over the values earlier steps returned (bound parameters on this path)."""
    return build(bindparam("expires_at"), bindparam("issued_at"), bindparam("consumed_id"))


def _step_by_step(metered, params):
    if metered:
        counted = database.first("count", metering.count_statement, params)
        if counted is None:
            metering.refuse_over_limit()
        database.execute("raise_thresholds", events.threshold_statement,
                         {**params, "usage_count": counted.usage_count})
    known = database.first("read_intent", _read_intent, params)
    consumed = database.first("consume_intent", _consume, params)
    params.update(expires_at=known and known.expires_at, issued_at=known and known.issued_at,
                  consumed_id=consumed and consumed.id, first_sighting=False,
                  recorded_match_id=consumed and consumed.match_id)
    params["first_sighting"] = bool(database.execute(
        "record_sighting", lambda: _record_sighting(
            bindparam("consumed_id"), bindparam("recorded_match_id", type_=String)), params))
    reason = database.first("reason", lambda: select(_reason(_stepped(
        lambda *values: _checks(*values, bindparam("first_sighting"))))), params).reason
    if metered:
        database.execute("count_daily", lambda: metering.count_daily_statement(
            bindparam("reason")), {**params, "reason": reason})
    return reason


def _signature_ok(principal, intent_hash, response, now):
    """The response is signed under the caller's scheme, or under the previous one while its
    grace lasts (a tenant moving between schemes without downtime)."""
    canonical_payload = canonical_json(response["payload"])
    for scheme in _schemes(principal, now):
        message = signing_message(scheme, intent_hash, response["match_id"],
                                  response["timestamp"], canonical_payload)
        if scheme == "ed25519":
            public_keys = (principal.account.signing_public_keys or "").split(",")
            if ed25519_matches([key for key in public_keys if key], message,
                               response["signature"]):
                return True
        elif matches(_signing_secrets(principal, now), message, response["signature"]):
            return True
    return False


def _schemes(principal, now):
    if principal.kind != "tenant":
        return ("bound",)  # admin keys sign with their own secret, bound scheme
    account = principal.account
    if account.previous_signature_scheme and (account.previous_scheme_valid_until or 0) >= now:
        return (account.signature_scheme, account.previous_signature_scheme)
    return (account.signature_scheme,)


def _signing_secrets(principal, now):
    account = principal.account
    try:
        secrets = [crypto.unseal(account.signing_secret_sealed)]
        previous = getattr(account, "previous_signing_secret_sealed", None)
        if previous and (account.previous_signing_secret_expires_at or 0) >= now:
            secrets.append(crypto.unseal(previous))
    except crypto.SealedSecretError:
        # Nothing was consumed or counted yet. The operator's to fix (add the key that sealed
        # it to the ring, or rotate the secret), so no Retry-After.
        whose = "tenant_id" if principal.kind == "tenant" else "admin_key_id"
        log.error("a stored signing secret cannot be unsealed with SECRET_ENCRYPTION_KEY",
                  extra={whose: principal.id})
        raise Unavailable(database.UNAVAILABLE_TEXT) from None
    return secrets
