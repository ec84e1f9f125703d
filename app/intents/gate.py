"""The verification gate: consume the intent, count the verification, judge the response.

CONTRACT.md's checks are written once, in order, as SQL conditions (`_checks`); the first that
holds is the block reason. The steps are SQLAlchemy Core statements, also written once: count
the verification against a limited plan (never past it), consume the intent, record the
match_id when every other check passed, name the reason, count the outcome for the day (the
month's usage_count is the sum of its days: app.tenants.metering). PostgreSQL runs them in a
PL/pgSQL function (one round trip, atomic, self-committing); SQLite runs the same statements
under the same conditions from Python, inside one BEGIN IMMEDIATE transaction.

A principal kept in Redis (app.tenants.key_cache) is confirmed by the gate's first step, before
anything is counted or consumed: when it no longer matches the database, the gate writes
nothing and answers `stale` (StaleCredentials: app.auth runs the request on a fresh lookup).

The intent's one write (consumed_at, and the match_id it records) touches no indexed column, so
PostgreSQL makes it a HOT update: no index entry, the least WAL (deploy/README: capacity).
"""
import logging
from datetime import datetime, timezone

from flask import current_app
from sqlalchemy import and_, bindparam, case, literal, not_, select, true, update

from app import crypto, database
from app.clock import billing_period, now_seconds, utc_day
from app.errors import Unavailable
from app.intents import reasons
from app.intents.models import Intent, SeenResponse
from app.intents.signature import canonical_json, ed25519_matches, matches, signing_message
from app.tenants import key_cache, keys, metering
from app.webhooks import events

log = logging.getLogger(__name__)


def result(cleared, reason, canonical_payload):
    """The verdict as answered, written as JCS (RFC 8785) text: a cleared payload comes back as
    the very bytes whose signature was checked (`canonical_payload`, the payload's JCS form), its
    numbers spelled as JCS spells them (1.0 as 1, -0.0 as 0, 1e16 as 10000000000000000, 1e-6 as
    0.000001), where a JSON encoder of Python's floats would write 1e+16 and 1e-06. The keys are
    sorted and the text compact, as every other answer's."""
    if cleared:
        # JCS of {"cleared": true, "payload": P, "reason": null}, keys in JCS's order, without
        # writing the payload a second time.
        text = b'{"cleared":true,"payload":' + canonical_payload + b',"reason":null}'
    else:
        text = canonical_json({"cleared": False, "reason": reason, "payload": None})
    # flask-smorest returns a Response as it is: the schema documents this body, not writes it.
    return current_app.response_class(text, mimetype="application/json")


def verify(principal, original_intent_hash, response, canonical_payload):
    """Judge a validated ScaleResponse whose payload's JCS form is `canonical_payload`; return
    the block reason, or None when cleared.
    Raises 429 when the tenant's plan is used up (then nothing was consumed or counted)."""
    now = now_seconds()
    params = {
        "now": now, "intent_hash": original_intent_hash, "owner": principal.owner,
        "match_id": response["match_id"],
        "signature_ok": _signature_ok(principal, original_intent_hash, response,
                                      canonical_payload, now),
        "timestamp": response["timestamp"],  # within +/-(2**53 - 1): the schema says so
        "skew": current_app.config["CLOCK_SKEW_SECONDS"],
        # A principal from the key cache is confirmed by the gate itself (app.tenants.key_cache).
        "digest": principal.fingerprint and principal.account.key_digest,
        "fingerprint": principal.fingerprint,
    }
    # A tenant's verification is counted against its plan; an admin key's is not. The plan's
    # limit is read by the gate itself, from the tenant's row as it is then
    # (metering.plan_limit_now), never from the principal read before.
    params.update(tenant_id=None, period=None, day=None, plan_limit=None, event_id=None)
    if principal.kind == "tenant":
        today = datetime.fromtimestamp(now, timezone.utc)  # the day is of the month counted
        params.update(tenant_id=principal.id, period=billing_period(today), day=utc_day(today),
                      event_id=events.new_event_id())
    if database.current().composes_writes:
        return _in_one_call(params)
    return _step_by_step(params)


def _checks(expires_at, issued_at, consumed_id, first_sighting):
    """CONTRACT.md's checks in order, as (reason, SQL condition that blocks)."""
    now, skew, timestamp = bindparam("now"), bindparam("skew"), bindparam("timestamp")
    return (
        (reasons.UNKNOWN, expires_at.is_(None)),
        # Whole seconds: now reaching expires_at is the time being past it (the instant itself
        # aside). `now > expires_at` cleared an intent up to a second after its expiry.
        (reasons.EXPIRED, now >= expires_at),
        (reasons.REPLAYED_INTENT, consumed_id.is_(None)),
        (reasons.INVALID_SIGNATURE, not_(bindparam("signature_ok"))),
        (reasons.OUT_OF_WINDOW, not_(timestamp.between(issued_at - skew, now + skew))),
        (reasons.REPLAYED_RESPONSE, not_(first_sighting)),
    )


def _may_record(expires_at, issued_at, consumed_id):
    """The match_id is recorded only when every check before its own replay check passes."""
    checks = _checks(expires_at, issued_at, consumed_id, first_sighting=true())
    return and_(*(not_(blocks) for _, blocks in checks[:-1]))


# -- the steps --------------------------------------------------------------------------------

def _this_intent():
    intents = Intent.__table__
    return and_(intents.c.intent_hash == bindparam("intent_hash"),
                intents.c.owner == bindparam("owner"))


def _read_intent():
    """The intent as it is, for a verification that did not consume it (unknown, or used)."""
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
            .returning(intents.c.id, intents.c.match_id, intents.c.issued_at,
                       intents.c.expires_at))


def _record_sighting():
    """Record the consumed intent's match_id (:recorded_match_id); a row back when it was new."""
    seen = SeenResponse.__table__
    return (database.current().insert(seen)
            .values(owner=bindparam("owner"), match_id=bindparam("recorded_match_id"),
                    intent_id=bindparam("consumed_id"))
            .on_conflict_do_nothing().returning(seen.c.intent_id))


def _reason():
    """The first check that blocks, over what the steps before found (None: cleared)."""
    checks = _checks(bindparam("expires_at"), bindparam("issued_at"), bindparam("consumed_id"),
                     bindparam("first_sighting"))
    return case(*((blocks, literal(reason)) for reason, blocks in checks))


# The steps, in order, once per dialect: the same statements under the same conditions.
# - count the verification against a limited plan for the month; if the plan is used up,
#   stop: nothing is consumed or counted, and the answer is the 429;
# - raise the usage.threshold events that count crosses (a limited plan only);
# - consume the intent; if it was not consumed (unknown or used), read it as it is;
# - record the match_id the consume noted, if it noted one: a first sighting if new;
# - name the reason, and count the verification by outcome for the day (metered: a tenant's
#   key; the month's usage_count is the sum of its days): adding to the day's row, and
#   inserting it only when it is not there.
# Atomicity is the database's: the conditional UPDATE consumes an intent at most once however
# many workers race for it, the seen_responses key catches a replayed match_id, and the usage
# upsert never passes the plan limit; one transaction holds all the steps.

# PostgreSQL: one function, one round trip, its own transaction (or the caller's). It answers
# the reason (NULL: cleared), or one of these, which no reason is spelled like:
_STALE = "stale"  # the kept principal no longer matches: nothing was written
_OVER_LIMIT = "over_limit"  # the limited plan is used up: nothing was consumed or counted


def _verify_steps(sql):
    return f"""IF p_tenant_id IS NOT NULL THEN
  PERFORM pg_advisory_xact_lock_shared({metering.PLAN_LOCK}, p_tenant_id);
END IF;
IF p_fingerprint IS NOT NULL THEN
  {_confirm_principal(sql)}
ELSIF p_tenant_id IS NOT NULL THEN
  {sql(metering.plan_limit_now())} INTO p_plan_limit;
END IF;
IF p_plan_limit IS NOT NULL THEN
  {sql(metering.count_within_plan_statement())} INTO p_usage_count;
  IF p_usage_count IS NULL THEN
    RETURN '{_OVER_LIMIT}';
  END IF;
  {sql(events.threshold_statement())};
END IF;
{sql(_consume())} INTO p_consumed_id, p_recorded_match_id, p_issued_at, p_expires_at;
IF p_consumed_id IS NULL THEN
  {sql(_read_intent())} INTO p_issued_at, p_expires_at;
END IF;
p_first_sighting := false;
IF p_recorded_match_id IS NOT NULL THEN
  {sql(_record_sighting())} INTO p_sighting;
  p_first_sighting := FOUND;
END IF;
p_reason := {sql(_reason())};
IF p_tenant_id IS NOT NULL THEN
  IF p_reason IS NULL THEN
    {sql(metering.add_cleared_to_day_statement())};
  ELSE
    {sql(metering.add_to_day_statement())};
  END IF;
  IF NOT FOUND THEN
    {sql(metering.count_daily_statement())};
  END IF;
END IF;
RETURN p_reason;"""


def _confirm_principal(sql):
    """The first step for a principal from the key cache (:fingerprint): it must match the
    database still, or the gate answers `stale` having written nothing. The same statement
    reads the tenant's plan limit (under the plan lock, as the separate read does)."""
    return keys.confirmation_steps(sql, f"RETURN '{_STALE}';", metering.plan_limit())


# Every verify runs it (tenant_id NULL: an admin key's, not metered), as a function PostgreSQL
# plans once per connection. Named anew when its result changed to the one value: workers of
# the previous release, during a rolling restart, still call intentgate_verification_gate
# (and before it intentgate_verify), which stay.
VERIFY_FUNCTION = database.ScalarProcedure(
    "intentgate_verdict", _verify_steps,
    arguments=[("now", "bigint"), ("intent_hash", "text"), ("owner", "text"),
               ("match_id", "text"), ("signature_ok", "boolean"), ("timestamp", "bigint"),
               ("skew", "bigint"), ("tenant_id", "integer"), ("period", "text"), ("day", "text"),
               ("plan_limit", "bigint"), ("event_id", "text"), ("digest", "text"),
               ("fingerprint", "text")],
    variables=[("current", "text"), ("public_keys", "boolean"), ("usage_count", "bigint"),
               ("consumed_id", "bigint"), ("recorded_match_id", "text"), ("issued_at", "bigint"),
               ("expires_at", "bigint"),
               ("sighting", "bigint"), ("first_sighting", "boolean"), ("reason", "text")],
    returns=[("reason", "text")],
)


def _in_one_call(params):
    reason = database.call(VERIFY_FUNCTION, params).reason
    if reason == _OVER_LIMIT:
        metering.refuse_over_limit()
    if reason == _STALE:
        raise key_cache.StaleCredentials()
    return reason


# SQLite: the same steps from Python, inside the view's BEGIN IMMEDIATE transaction (which
# orders them with a plan change: no plan lock).
def _step_by_step(params):
    if params["tenant_id"] is not None:
        params["plan_limit"] = database.first("plan_limit_now", metering.plan_limit_now,
                                              params).plan_limit
    if params["plan_limit"] is not None:
        counted = database.first("count_within_plan", metering.count_within_plan_statement,
                                 params)
        if counted is None:
            metering.refuse_over_limit()
        params["usage_count"] = counted.usage_count
        database.execute("raise_thresholds", events.threshold_statement, params)
    consumed = database.first("consume_intent", _consume, params)
    if consumed is None:
        known = database.first("read_intent", _read_intent, params)
        params.update(consumed_id=None, recorded_match_id=None,
                      issued_at=known and known.issued_at, expires_at=known and known.expires_at)
    else:
        params.update(consumed_id=consumed.id, recorded_match_id=consumed.match_id,
                      issued_at=consumed.issued_at, expires_at=consumed.expires_at)
    params["first_sighting"] = params["recorded_match_id"] is not None and bool(
        database.execute("record_sighting", _record_sighting, params))
    reason = database.first("reason", lambda: select(_reason().label("reason")), params).reason
    if params["tenant_id"] is not None:
        # The upsert alone: the UPDATE PostgreSQL tries first only spares it the upsert's cost.
        database.execute("count_daily", metering.count_daily_statement,
                         {**params, "reason": reason})
    return reason


def _signature_ok(principal, intent_hash, response, canonical_payload, now):
    """The response is signed under the caller's scheme, or under the previous one while its
    grace lasts (a tenant moving between schemes without downtime)."""
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
        if principal.fingerprint is not None:
            # A kept principal's copy may be older than the database's (sealed under a key a
            # reseal has since retired): a fresh lookup decides, and says so if it fails too.
            raise key_cache.StaleCredentials() from None
        # Nothing was consumed or counted yet. The operator's to fix (add the key that sealed
        # it to the ring, or rotate the secret), so no Retry-After.
        whose = "tenant_id" if principal.kind == "tenant" else "admin_key_id"
        log.error("a stored signing secret cannot be unsealed with SECRET_ENCRYPTION_KEY",
                  extra={whose: principal.id})
        raise Unavailable(database.UNAVAILABLE_TEXT) from None
    return secrets
