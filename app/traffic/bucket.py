"""The per-tenant request rate: one token bucket per tenant (or admin key), shared by every worker.

With REDIS_URL the bucket is a Redis hash updated by one Lua script (one round trip, atomic, on
Redis's clock). Without it, the embedded setup keeps the bucket in a database row updated by one
conditional UPDATE. Either way no state lives in the worker's memory.
"""
import math
import os
import threading
import time
from dataclasses import dataclass

import redis
from flask import current_app
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from sqlalchemy import bindparam, select, text

from app import database
from app.errors import Unavailable
from app.traffic.models import RateBucket

KEY_PREFIX = "intentgate:bucket:"

# KEYS[1] bucket; ARGV capacity, refill per second. Leaves `tokens` as the bucket holds now.
_REFILL_LUA = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
"""
# Returns the tokens as a string, spending none and writing nothing.
PEEK_LUA = _REFILL_LUA + "return tostring(tokens)\n"
# Returns {allowed, tokens left as string}.
TOKEN_BUCKET_LUA = _REFILL_LUA + """local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity / rate) * 1000) + 1000)
return {allowed, tostring(tokens)}
"""


class StoreUnavailable(Exception):
    """The rate-limit store did not answer."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    capacity: int
    remaining: int
    reset_at: int
    retry_after: int


def _decision(allowed, tokens, capacity, rate, now):
    return Decision(
        allowed=allowed,
        capacity=capacity,
        remaining=int(math.floor(tokens)),
        reset_at=int(math.ceil(now + (capacity - tokens) / rate)),
        retry_after=0 if allowed else max(1, int(math.ceil((1 - tokens) / rate))),
    )


class RedisBucket:
    def __init__(self, url, socket_timeout, cluster_nodes=None):
        self.url, self.cluster = url, bool(cluster_nodes)
        self.timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
        if cluster_nodes:
            # A bucket lives in its key's slot: a master that is down takes only its own
            # slots' buckets with it (require_full_coverage=False), the others keep answering.
            # Two quick retries (MOVED after a failover is followed on top of them): a request
            # whose master is gone gets the outage answer in well under a second.
            self._client = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in cluster_nodes],
                require_full_coverage=False,
                retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.05), retries=2),
                **self.timeouts)
            self._cluster_scripts = self._register(self._client)
        else:
            self._own = threading.local()

    def _connected(self):
        """(client, its scripts): the cluster client; or, for one node, this thread's client on
        one connection of its own.

        One connection a thread (not a pool checked out per command) cuts the Python calls
        of each command from about 160 to 90; redis-py was about a sixth of a verify's CPU
        in the profile. Not one a worker shared by its threads: while Redis does not answer,
        each thread would wait its turn and then its own timeout, and a request's 503 would
        come after threads x REDIS_SOCKET_TIMEOUT instead of one. The client connects on
        first use in the process that uses it: gunicorn forks workers from a master that
        built the app, and a socket must not be shared across processes."""
        if self.cluster:
            return self._client, self._cluster_scripts
        own = self._own
        if getattr(own, "pid", None) != os.getpid():
            client = redis.Redis.from_url(self.url, single_connection_client=True,
                                          **self.timeouts)
            own.client, own.scripts, own.pid = client, self._register(client), os.getpid()
        return own.client, own.scripts

    @staticmethod
    def _register(client):
        return {"take": client.register_script(TOKEN_BUCKET_LUA),
                "peek": client.register_script(PEEK_LUA)}

    def take(self, owner, capacity, rate):
        allowed, tokens = self._run("take", owner, capacity, rate)
        return _decision(bool(allowed), float(tokens), capacity, rate, time.time())

    def peek(self, owner, capacity, rate):
        tokens = float(self._run("peek", owner, capacity, rate))
        return _decision(tokens >= 1, tokens, capacity, rate, time.time())

    def _run(self, script, owner, capacity, rate):
        # The braces are a hash tag: in a Redis Cluster the bucket's key names its own slot.
        try:
            client, scripts = self._connected()
            return scripts[script](keys=[f"{KEY_PREFIX}{{{owner}}}"], args=[capacity, rate],
                                   client=client)
        except redis.RedisError as exc:
            raise StoreUnavailable(type(exc).__name__) from exc

    def available(self):
        """Every node that holds buckets answers (a cluster's masters, each of them)."""
        try:
            client, _ = self._connected()
            if self.cluster:
                return bool(client.ping(target_nodes=RedisCluster.PRIMARIES))
            return bool(client.ping())
        except redis.RedisError:
            return False


# Refill, then take one token, in a single statement; matches no row when the bucket is empty.
_TAKE_SQL = text(
    """
    UPDATE rate_buckets SET
      tokens = CASE WHEN tokens + (:now - updated_at) * :rate > :capacity
                    THEN :capacity ELSE tokens + (:now - updated_at) * :rate END - 1,
      updated_at = :now
    WHERE bucket = :bucket AND tokens + (:now - updated_at) * :rate >= 1
    RETURNING tokens
    """
)


class DatabaseBucket:
    """The embedded setup's bucket: one row per owner, each step a self-contained statement."""

    def take(self, owner, capacity, rate):
        now = time.time()
        params = {"bucket": owner, "now": now, "rate": rate, "capacity": capacity}
        row = database.first("bucket_take", lambda: _TAKE_SQL, params)
        if row is None:
            # No row yet, or an empty bucket: create it full (a no-op if it exists), try again.
            database.execute("bucket_create", _create_bucket, params)
            row = database.first("bucket_take", lambda: _TAKE_SQL, params)
        if row is not None:
            return _decision(True, row.tokens, capacity, rate, now)
        return _decision(False, _left(owner, capacity, rate, now), capacity, rate, now)

    def peek(self, owner, capacity, rate):
        now = time.time()
        try:
            left = _left(owner, capacity, rate, now)
        except Unavailable as exc:  # the database is down: so is this store
            raise StoreUnavailable("database") from exc
        return _decision(left >= 1, left, capacity, rate, now)

    def available(self):
        return True


def _left(owner, capacity, rate, now):
    """The tokens `owner`'s bucket row holds at `now` (a bucket not made yet is full)."""
    state = database.first("bucket_state", _bucket_state, {"bucket": owner})
    if state is None:
        return capacity
    return min(capacity, state.tokens + (now - state.updated_at) * rate)


def _create_bucket():
    buckets = RateBucket.__table__
    return (database.current().insert(buckets)
            .values(bucket=bindparam("bucket"), tokens=bindparam("capacity"),
                    updated_at=bindparam("now"))
            .on_conflict_do_nothing())


def _bucket_state():
    buckets = RateBucket.__table__
    return select(buckets.c.tokens, buckets.c.updated_at).where(
        buckets.c.bucket == bindparam("bucket"))


def init_app(app):
    if app.config["REDIS_URL"]:
        app.extensions["rate_bucket"] = RedisBucket(
            app.config["REDIS_URL"], app.config["REDIS_SOCKET_TIMEOUT"],
            app.config.get("REDIS_CLUSTER_NODES"),
        )
    else:
        app.extensions["rate_bucket"] = DatabaseBucket()


def take(owner, capacity, rate):
    """Spend one token of `owner`'s bucket (`capacity` tokens, refilling `rate` per second)."""
    return current_app.extensions["rate_bucket"].take(owner, capacity, rate)


def peek(owner, capacity, rate):
    """What `owner`'s bucket holds now, spending nothing."""
    return current_app.extensions["rate_bucket"].peek(owner, capacity, rate)


def store_available():
    return current_app.extensions["rate_bucket"].available()
