"""Issuing intent signatures, and purging the expired ones."""
import hashlib
import secrets
import time

from flask import current_app, g
from sqlalchemy import BigInteger, bindparam, delete, func, insert, literal, select, tuple_

from app import database
from app.clock import billing_period, now_seconds
from app.context_store import client as context_store
from app.extensions import db
from app.intents.models import IdempotencyRecord, Intent, SeenResponse
from app.sql import delete_batch
from app.tenants import key_cache, keys, metering
from app.tenants.plans import monthly_limit


HASH_PREFIX = "sha256:"
IDEMPOTENCY_WINDOW = 24 * 3600


def new_intent_hash(owner):
    """sha256 over 32 fresh random bytes and server-side data only: nothing from the user."""
    material = secrets.token_bytes(32) + f"|{owner}|{time.time_ns()}".encode()
    return HASH_PREFIX + hashlib.sha256(material).hexdigest()


def _insert_intent():
    intents = Intent.__table__
    values = {name: bindparam(name) for name in (
        "intent_hash", "owner", "intent_class", "issued_at", "expires_at")}
    if database.current().dialect_name == "sqlite":
        # The key is (owner, id), and SQLite numbers only a lone INTEGER PRIMARY KEY: the
        # next id comes from the statement itself (SQLite runs one writer at a time).
        values["id"] = select(func.coalesce(func.max(intents.c.id), 0) + 1).scalar_subquery()
    return insert(intents).values(values)


def _issue_steps(sql):
    stale = keys.confirmation_steps(sql, "RETURN false;")
    return f"""{stale}
IF p_plan_limit IS NOT NULL THEN
  {sql(_month_fits())} INTO p_fits;
  IF p_fits IS NULL THEN
    RETURN NULL;
  END IF;
END IF;
{sql(_insert_intent().inline())};
RETURN true;"""


def _month_fits():
    """A row when one more verification fits :tenant_id's plan (:plan_limit) in :period."""
    return select(literal(1)).where(metering.within_plan(
        metering.month_total(bindparam("tenant_id"), bindparam("period")),
        bindparam("plan_limit", type_=BigInteger)))


# A principal from the key cache issues its intent through this function, in one round trip:
# the INSERT runs only while the principal matches the database (`issued` false otherwise),
# and for a limited plan only while the month has room (`issued` NULL otherwise), which a
# kept principal cannot tell (app.tenants.key_cache). One value, as the gate's
# (database.ScalarProcedure): workers of the previous release, during a rolling restart, still
# call intentgate_issue_intent, which stays.
ISSUE_FUNCTION = database.ScalarProcedure(
    "intentgate_issue", _issue_steps,
    arguments=[("intent_hash", "text"), ("owner", "text"), ("intent_class", "text"),
               ("issued_at", "bigint"), ("expires_at", "bigint"), ("digest", "text"),
               ("now", "bigint"), ("fingerprint", "text"), ("tenant_id", "integer"),
               ("period", "text"), ("plan_limit", "bigint")],
    variables=[("current", "text"), ("public_keys", "boolean"), ("fits", "integer")],
    returns=[("issued", "boolean")],
)


def generate(principal, user_token, ttl):
    """Issue an intent signature: one INSERT, after the context store answered (no database
    transaction or lock is held while we wait on another service)."""
    metering.refuse_if_over_plan(principal)
    tags = _tags(user_token)
    intent_class = current_app.extensions["taxonomy"].classify(tags)
    issued_at = now_seconds()
    intent = {"intent_hash": new_intent_hash(principal.owner), "owner": principal.owner,
              "intent_class": intent_class, "issued_at": issued_at,
              "expires_at": issued_at + ttl}
    if principal.fingerprint is None:
        database.execute("insert_intent", _insert_intent, intent)
    else:
        _issue_confirmed(principal, intent)
    g.intent_class = intent_class  # for the access log line
    return intent


def _issue_confirmed(principal, intent):
    row = database.call(ISSUE_FUNCTION, {
        **intent, "digest": principal.account.key_digest, "now": intent["issued_at"],
        "fingerprint": principal.fingerprint, "tenant_id": principal.id,
        "period": billing_period(), "plan_limit": monthly_limit(principal.tenant.plan)})
    if row.issued is None:
        metering.refuse_over_limit()
    if not row.issued:
        raise key_cache.StaleCredentials()


def _tags(user_token):
    """The context store's tags for the token, asked once per request: a request run again on
    a fresh principal (app.auth) reuses its answer, or its failure."""
    if "context_answer" not in g:
        try:
            g.context_answer = context_store.tags_for(user_token)
        except Exception as exc:
            g.context_answer = exc
            raise
    if isinstance(g.context_answer, Exception):
        raise g.context_answer
    return g.context_answer


def purge_expired_intents(cutoff, batch_size):
    """Delete up to `batch_size` intents that expired before `cutoff`, with their replay
    records; return how many (0 when none is left)."""
    expired = db.session.execute(
        select(Intent.owner, Intent.id, Intent.match_id)
        .where(Intent.expires_at < cutoff).limit(batch_size)
    ).all()
    sightings = [(owner, match_id, id_) for owner, id_, match_id in expired if match_id]
    if sightings:
        # By the replay record's key; only the one this intent's verify wrote (intent_id).
        db.session.execute(delete(SeenResponse).where(tuple_(
            SeenResponse.owner, SeenResponse.match_id, SeenResponse.intent_id).in_(sightings)))
    if expired:
        db.session.execute(delete(Intent).where(
            tuple_(Intent.owner, Intent.id).in_([(owner, id_) for owner, id_, _ in expired])))
    return len(expired)


def purge_idempotency_records(batch_size):
    """Delete up to `batch_size` idempotency records past their 24 h window; return how many
    (0 when none is left). Every SDK verify writes one, so a day's worth can be the size of a
    day's traffic: one DELETE of them all would be one long transaction."""
    return delete_batch((IdempotencyRecord.owner, IdempotencyRecord.idempotency_key),
                        IdempotencyRecord.created_at < now_seconds() - IDEMPOTENCY_WINDOW,
                        limit=batch_size)
