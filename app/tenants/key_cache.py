"""Who holds a key, shared through Redis so that generate and verify need not ask the primary.

Measured (pgbench, PostgreSQL CPU per call): the key lookup is 0.11 ms of a verify's 0.37, a
statement of its own on the one server that does not scale out. Here a tenant's principal, as
the lookup read it, is kept in REDIS_URL beside the rate limits: shared by every worker on every
host, never in a process's memory. It is trusted for nothing by itself:

- The statement that acts on it confirms it, as its first step: the gate and the intent's
  INSERT first read the key and its tenant again (two index probes inside a function PostgreSQL
  keeps planned) and compare the principal's fingerprint: the tenant row's
  credentials_version, which a trigger moves on at every UPDATE of the row, the key's scopes,
  and an Ed25519 tenant's active public keys (app.tenants.keys). A key revoked or expired, a
  tenant deactivated, a plan, signing secret, scheme or signing key changed, by the service or
  by an operator's SQL: the fingerprint differs (or the key is no longer found), nothing is
  written, and the request is answered from a fresh lookup (StaleCredentials, app.auth), so a
  change is refused or applied from the moment it commits, as without the cache.
- An entry is sealed with an HMAC under a key derived from SECRET_ENCRYPTION_KEY and bound to
  its digest: whoever can write to Redis cannot make the service trust a principal it did not
  read (another tenant, other signing keys).
- A key's expiry is kept with it: an entry lives no longer than its key, and one read past the
  expiry is a miss. The write would refuse it too, but a generate asks the context store
  first, and an expired key must not send a user's token anywhere.
- Only an unlimited plan's principals are kept. A limited plan's month is counted against it,
  and a used-up month must refuse a generate before it sends the user's token to the context
  store, which only a lookup (its usage_count) can tell; limited plans are the small tenants,
  so their lookups cost the primary little. A move to a limited plan forgets what was kept.
  (The gate and the INSERT's function still count and check the month for a kept principal
  of a limited plan, should one be acted on.)

A miss, a failure of Redis or an open rate-limit breaker are answered alike: the lookup runs as
before (a failure opens the breaker: one timeout a second per worker in all).
The digest names the entry (it is what the database stores of a key too); the plaintext key is
never written anywhere.
"""
import hashlib
import hmac
import json
import logging
from functools import lru_cache
from types import SimpleNamespace

import redis
from flask import current_app
from redis.exceptions import RedisClusterException

from app import sql
from app.clock import now_seconds
from app.extensions import limiter
from app.keyring import ring
from app.tenants import keys
from app.tenants.plans import monthly_limit

log = logging.getLogger(__name__)

PREFIX = "intentgate:principal:"
# Entries are confirmed at every use, so how long one lives bounds only Redis's memory.
TTL_SECONDS = 600
_MAC_CONTEXT = b"intentgate principal cache v1"
_NOT_KEPT = ("usage_count",)  # changes with every verification: read from the lookup only


class StaleCredentials(Exception):
    """The principal a statement was given no longer matches the database: nothing was
    written; authenticate afresh and run the request again."""


def init_app(app):
    """Enabled where the primary confirms a principal (PostgreSQL) and Redis is the limiter's
    storage; the embedded setup asks the database every time."""
    enabled = bool(app.config["REDIS_URL"]) and app.config[
        "SQLALCHEMY_DATABASE_URI"].startswith("postgresql")
    app.extensions["key_cache"] = enabled


def get(digest):
    """The principal's row kept for `digest` (with its fingerprint), or None."""
    stored = _command("GET", PREFIX + digest)
    if stored is None:
        return None
    if isinstance(stored, str):  # a client made with decode_responses
        stored = stored.encode("utf-8")
    mac, _, text = stored.partition(b" ")
    if not any(hmac.compare_digest(mac, _mac(key, digest, text).encode("ascii"))
               for key in _mac_keys(current_app.config["SECRET_ENCRYPTION_KEY"])):
        log.warning("a kept principal failed its integrity check: ignored")
        return None
    fields = json.loads(text)
    if fields.keys() != _kept_fields():
        return None  # kept by a release whose principal had other columns: a miss
    if not _unexpired(fields["key_expires_at"], now_seconds()):
        return None  # the key expired while kept (see the module's docstring)
    return SimpleNamespace(**fields)


def put(tenant, replacing=False):
    """Keep what a fresh lookup read; `replacing`: the lookup ran because what was kept no
    longer matched, so a principal that is not to be kept (a limited plan's) forgets it rather
    than leave it to send user tokens to the context store until it expires."""
    if tenant.fingerprint is None:
        return
    if monthly_limit(tenant.plan) is not None:
        if replacing:
            forget(tenant.key_digest)
        return
    fields = {name: value for name, value in tenant._asdict().items() if name not in _NOT_KEPT}
    text = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    digest = tenant.key_digest
    now = now_seconds()
    if _unexpired(tenant.key_expires_at, now):  # kept no longer than the key lives
        lifetime = TTL_SECONDS if tenant.key_expires_at is None else min(
            TTL_SECONDS, tenant.key_expires_at - now)
        _command("SET", PREFIX + digest, _sealed(digest, text), "EX", lifetime)


def forget(digest):
    _command("DEL", PREFIX + digest)


def forget_when_committed(digests):
    """Forget the principals kept for `digests` once the change that refuses them (a key
    revoked or rotated, a tenant deactivated) commits. The write that acts on a kept principal
    refuses it anyway; forgotten, it is refused before the request does anything at all (a
    generate would send the user's token to the context store first)."""
    if not current_app.extensions.get("key_cache"):
        return
    for digest in digests:  # one key a command: in a Redis Cluster, keys of several slots
        sql.after_commit(lambda digest=digest: forget(digest))


def _unexpired(key_expires_at, now):
    """As the key lookup decides: a key works while its expiry is ahead."""
    return key_expires_at is None or key_expires_at > now


@lru_cache(maxsize=1)
def _kept_fields():
    return {name for name, _ in keys.KEY_LOOKUP_FUNCTION.returns} - set(_NOT_KEPT)


def _command(*command):
    """The command's reply, on the connection the rate limits use (app.traffic.strategy); None
    when the cache is off, the limiter's breaker is open or Redis fails (the lookup answers
    instead)."""
    strategy = limiter.limiter
    if not current_app.extensions.get("key_cache") or strategy.broken:
        return None
    try:
        return strategy.execute(*command)
    except (redis.RedisError, RedisClusterException) as exc:
        # When the store did not answer, the limiter's breaker opens until it answers again, so
        # this worker waits for it once in all, not once here and once for the bucket; an error
        # the store answered (a refused command) concerns these keys only. A cluster none of
        # whose nodes answers fails as RedisClusterException (app.traffic.cluster).
        log.warning("principal cache unavailable", extra={"failure": type(exc).__name__})
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, RedisClusterException)):
            strategy.trip()
        return None


def _sealed(digest, text):
    """The entry: its MAC under the ring's first key, and the text."""
    sealing = _mac_keys(current_app.config["SECRET_ENCRYPTION_KEY"])[0]
    return _mac(sealing, digest, text).encode("ascii") + b" " + text


def _mac(key, digest, text):
    return hmac.new(key, digest.encode("ascii") + b"\n" + text, hashlib.sha256).hexdigest()


@lru_cache(maxsize=4)
def _mac_keys(ring_text):
    """A MAC key for each key of the ring, the sealing key's first: an entry is sealed under
    the first and recognised under any, so processes whose rings differ in order or in a key
    (a rotation rolling out) share what they keep rather than each take the other's for
    tampering."""
    return tuple(hmac.new(key.encode("utf-8"), _MAC_CONTEXT, hashlib.sha256).digest()
                 for key in ring.keys(ring_text))
