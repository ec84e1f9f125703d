"""A tenant's API keys: several active at once (create a second, deploy it, revoke the first),
each refused at once on every worker when revoked or expired. Shared by the tenant API, the
admin API and the CLI; the caller owns the transaction.
"""
import logging
import secrets

from sqlalchemy import (String, Text, bindparam, case, cast, func, literal, or_, select,
                        update)
from sqlalchemy.dialects.postgresql import aggregate_order_by

from app import crypto, database
from app.clock import billing_period, expiry, now_seconds
from app.errors import Conflict, NotFound, Unauthorized
from app.extensions import db
from app.tenants import audit, key_cache, metering, scopes as key_scopes
from app.tenants.tenant_row import INACTIVE_KEY, active_keys, existing_tenant, locked_tenant
from app.tenants.models import ApiKey, SigningKey, Tenant

log = logging.getLogger(__name__)

MAX_ACTIVE_KEYS = 10
TOO_MANY = f"a tenant holds at most {MAX_ACTIVE_KEYS} active API keys: revoke one first"
LAST_KEY = "this is the tenant's last active API key: create another one first"
DEFAULT_NAME = "default"


def _active_count(tenant_id, now):
    return db.session.execute(
        select(func.count()).select_from(ApiKey).where(ApiKey.tenant_id == tenant_id,
                                                       *active_keys(now))
    ).scalar_one()


def issue(tenant_id, scopes, name=DEFAULT_NAME, expires_at=None, now=None):
    """Add a key row holding `scopes`; return (row, plaintext key). The plaintext exists only in
    this answer."""
    now = now_seconds() if now is None else now
    api_key = crypto.new_api_key()
    row = ApiKey(id="ak_" + secrets.token_hex(12), tenant_id=tenant_id, name=name,
                 key_digest=crypto.key_digest(api_key), prefix=crypto.display_prefix(api_key),
                 scopes=key_scopes.stored(scopes), created_at=now, expires_at=expires_at)
    db.session.add(row)
    db.session.flush()
    return row, api_key


def create_key(tenant_id, name=DEFAULT_NAME, expires_in=None, scopes=None, granting=None):
    """A new key holding `scopes` (default: intents only). `granting` is the scopes of the key
    that asks, which the new key may not exceed; None for an operator (admin key, CLI)."""
    scopes = key_scopes.grantable(
        key_scopes.DEFAULT if scopes is None else frozenset(scopes), granting)
    locked_tenant(tenant_id)
    now = now_seconds()
    if _active_count(tenant_id, now) >= MAX_ACTIVE_KEYS:
        raise Conflict(TOO_MANY)
    row, api_key = issue(tenant_id, scopes, name, expiry(expires_in), now)
    audit.record(tenant_id, "api_key.created", key_id=row.id, prefix=row.prefix,
                 scopes=key_scopes.listed(row.scopes))
    log.info("api key created", extra={"tenant_id": tenant_id, "api_key_id": row.id})
    return row, api_key


def list_keys(tenant_id):
    """The tenant's keys that still authenticate, oldest first (never a secret)."""
    existing_tenant(tenant_id)
    return db.session.execute(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id, *active_keys(now_seconds()))
        .order_by(ApiKey.created_at, ApiKey.id)
    ).scalars().all()


def revoke_key(tenant_id, key_id):
    locked_tenant(tenant_id)
    now = now_seconds()
    row = db.session.execute(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id, ApiKey.id == key_id, *active_keys(now))
    ).scalar_one_or_none()
    if row is None:
        raise NotFound("API key not found")
    if _active_count(tenant_id, now) == 1:
        raise Conflict(LAST_KEY)
    row.revoked_at = now
    db.session.flush()
    key_cache.forget_when_committed([row.key_digest])
    audit.record(tenant_id, "api_key.revoked", key_id=row.id, prefix=row.prefix)
    log.info("api key revoked", extra={"tenant_id": tenant_id, "api_key_id": row.id})
    return row


def rotate(tenant_id, key_id=None, operator=False):
    """Replace a key by a new one of the same name and expiry, in one transaction: the old key
    is refused from then on; returns the new key and the old key's row. With `key_id`
    (SPEC.md's rotate-key: the key that calls) the conditional UPDATE matches only while that
    key is active, so of two concurrent rotations with one key exactly one wins. An
    `operator` names the key, or may leave it out when the tenant holds only one: guessing
    among several would rotate a key in use and leave the one meant (a leaked one) working."""
    # The tenant's row first, as every key operation takes it: locking the key's row first
    # (the UPDATE), then the tenant's (the new key's foreign key, the audit entry) deadlocked
    # with another key's rotation or with the key's revocation, which hold them the other way.
    locked_tenant(tenant_id)
    now = now_seconds()
    if key_id is None:
        active = db.session.execute(
            select(ApiKey.id).where(ApiKey.tenant_id == tenant_id, *active_keys(now))
        ).scalars().all()
        if not active:
            raise NotFound("the tenant has no active API key")
        if len(active) > 1:
            raise Conflict(f"the tenant has {len(active)} active API keys: name the one to "
                           "rotate")
        (key_id,) = active
    old = db.session.execute(
        update(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id, *active_keys(now))
        .values(revoked_at=now)
        .returning(ApiKey.id, ApiKey.name, ApiKey.expires_at, ApiKey.prefix, ApiKey.scopes,
                   ApiKey.key_digest)
    ).first()
    if old is None:
        raise NotFound("API key not found") if operator else Unauthorized(INACTIVE_KEY)
    key_cache.forget_when_committed([old.key_digest])
    # The new key does what the old one did: rotation neither widens nor narrows a key.
    row, api_key = issue(tenant_id, key_scopes.held(old.scopes), old.name, old.expires_at, now)
    audit.record(tenant_id, "api_key.rotated", key_id=key_id, prefix=old.prefix,
                 new_key_id=row.id, new_prefix=row.prefix, scopes=key_scopes.listed(row.scopes))
    log.info("api key rotated", extra={"tenant_id": tenant_id, "api_key_id": row.id})
    return api_key, old


def _credentials(*columns):
    """SELECT `columns` of the active key whose digest is :digest (at :now) and its tenant."""
    tenants, keys = Tenant.__table__, ApiKey.__table__
    return (
        select(*columns)
        .select_from(keys.join(tenants, tenants.c.id == keys.c.tenant_id))
        .where(keys.c.key_digest == bindparam("digest"), keys.c.revoked_at.is_(None),
               or_(keys.c.expires_at.is_(None), keys.c.expires_at > bindparam("now")))
    )


def _credential_columns():
    """What a principal is made of: the tenant and the key (the signing keys: _public_keys)."""
    tenants, keys = Tenant.__table__, ApiKey.__table__
    return [*(tenants.c[name] for name, _ in _TENANT_COLUMNS), keys.c.id.label("api_key_id"),
            keys.c.key_digest, keys.c.prefix, keys.c.scopes]


def _public_keys(tenant_id):
    """The tenant's active Ed25519 public keys at :now, comma-separated base64 (NULL: none)."""
    signing = SigningKey.__table__
    if database.current().dialect_name == "postgresql":
        # In one order, so the fingerprint over them does not depend on the plan.
        joined = func.string_agg(signing.c.public_key,
                                 aggregate_order_by(literal(","), signing.c.id))
    else:
        joined = func.group_concat(signing.c.public_key, literal(","))
    return (
        select(joined)
        .where(signing.c.tenant_id == tenant_id, signing.c.revoked_at.is_(None),
               or_(signing.c.expires_at.is_(None), signing.c.expires_at > bindparam("now")))
        .scalar_subquery()
    )


# A principal's fingerprint, equal to a principal's only while nothing it was made of has
# changed: the tenant row's credentials_version, which a trigger moves on at every UPDATE of
# the row (never back, not even across a downgrade and upgrade: migration d6f8a0c2e419), and
# the key's scopes. The key's other columns never change (a rotation makes a new key); its
# revocation and expiry are the lookup's own conditions. It was an MD5 of every credential
# column's text: writing the row as text and hashing it cost 57,600 instructions of a verify's
# 559,600 (callgrind, bench/pg_instructions.py). The signing keys count only for a tenant on
# (or in grace from) the Ed25519 scheme, the only one that uses them: a change of scheme
# changes the tenant's row. The confirmation reads them in a statement of its own, run only
# then: a subquery in the first would cost every call its setup (measured with pgbench: about
# 0.015 ms of PostgreSQL CPU a call, a tenth of a verify's share).
def _row_fingerprint():
    tenants, keys = Tenant.__table__, ApiKey.__table__
    return cast(tenants.c.credentials_version, Text).concat(":").concat(keys.c.scopes)


def _with_public_keys(fingerprint, public_keys):
    # "|" is in neither part (digits, scope names, base64), so no two pairs give one text.
    return func.md5(fingerprint.concat("|").concat(func.coalesce(public_keys, literal(""))))


def _uses_public_keys():
    tenants = Tenant.__table__
    return or_(tenants.c.signature_scheme == "ed25519",
               tenants.c.previous_signature_scheme == "ed25519")


def _tenant_by_key_digest():
    tenants = Tenant.__table__
    public_keys = _public_keys(tenants.c.id)
    # The active Ed25519 public keys ride along, so verifying with them costs no second round
    # trip; a tenant without keys pays one index probe. SQLite keeps no fingerprint: nothing is
    # kept for it.
    fingerprint = literal(None, String)
    if database.current().dialect_name == "postgresql":
        fingerprint = case((_uses_public_keys(),
                            _with_public_keys(_row_fingerprint(), public_keys)),
                           else_=_row_fingerprint())
    # The key's expiry rides along (it never changes: a rotation makes a new key), so a kept
    # principal is not used past it (app.tenants.key_cache) even before a write confirms it.
    return _credentials(
        *_credential_columns(), ApiKey.__table__.c.expires_at.label("key_expires_at"),
        public_keys.label("signing_public_keys"),
        metering.month_total(tenants.c.id, bindparam("period")).label("usage_count"),
        fingerprint.label("fingerprint"))


def confirmation_steps(sql, stale, *also):
    """PL/pgSQL: whether the principal kept for :digest (:fingerprint, of :tenant_id) still
    matches the database at :now (app.tenants.key_cache); when it does not, the statements
    `stale` (which end the function), before anything is written. Variables: p_current text,
    p_public_keys boolean, and p_<name> for each labelled column of the tenant's row `also`
    reads in the same statement."""
    row = _credentials(_row_fingerprint(), _uses_public_keys(), *also)
    with_keys = select(_with_public_keys(bindparam("current", type_=Text),
                                         _public_keys(bindparam("tenant_id"))))
    into = "".join(f", p_{column.name}" for column in also)
    return f"""{sql(row)} INTO p_current, p_public_keys{into};
IF p_public_keys THEN
  {sql(with_keys)} INTO p_current;
END IF;
IF p_current IS DISTINCT FROM p_fingerprint THEN
  {stale}
END IF;"""


# What authentication reads of the tenant (as PostgreSQL types, for the function below).
_TENANT_COLUMNS = (
    ("id", "integer"), ("email", "character varying"), ("plan", "character varying"),
    ("active", "boolean"), ("signing_secret_sealed", "text"),
    ("previous_signing_secret_sealed", "text"), ("previous_signing_secret_expires_at", "bigint"),
    ("signature_scheme", "character varying"), ("previous_signature_scheme", "character varying"),
    ("previous_scheme_valid_until", "bigint"),
)
# Every authenticated request not served a kept principal runs this: PostgreSQL keeps it
# planned (see database.Function). Named anew whenever its result changes (key_expires_at):
# workers of the previous release, during a rolling restart, still call theirs
# (intentgate_principal_by_key_digest, intentgate_tenant_by_key_digest).
KEY_LOOKUP_FUNCTION = database.Function(
    "intentgate_key_principal", _tenant_by_key_digest,
    arguments=[("digest", "text"), ("period", "text"), ("now", "bigint")],
    returns=[*_TENANT_COLUMNS, ("api_key_id", "character varying"),
             ("key_digest", "character varying"), ("prefix", "character varying"),
             ("scopes", "character varying"), ("key_expires_at", "bigint"),
             ("signing_public_keys", "text"),
             ("usage_count", "bigint"), ("fingerprint", "text")],
)


def find_by_key_digest(digest):
    """The tenant holding this active key digest, with the key's id and prefix, this month's
    count against a limited plan (usage_count) and its active signing keys (request path: one
    statement)."""
    tenant = database.call(KEY_LOOKUP_FUNCTION,
                           {"digest": digest, "period": billing_period(), "now": now_seconds()})
    if tenant is None or not crypto.digests_match(tenant.key_digest, digest):
        return None
    return tenant
