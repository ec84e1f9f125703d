"""The per-tenant request rate: one token bucket per tenant (or admin key), shared by every worker.

With REDIS_URL the bucket is a Redis hash updated by one Lua script (one round trip, atomic, on
Redis's clock). Without it, the embedded setup keeps the bucket in a database row updated by one
conditional UPDATE. Either way no state lives in the worker's memory.
"""
import math
import time
from dataclasses import dataclass

import redis
from flask import current_app
from sqlalchemy import select, text

from app.extensions import db
from app.sql import upsert_insert
from app.traffic.models import RateBucket

KEY_PREFIX = "intentgate:bucket:"

# KEYS[1] bucket; ARGV capacity, refill per second. Returns {allowed, tokens left as string}.
TOKEN_BUCKET_LUA = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local allowed = 0
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


def _settings():
    config = current_app.config
    capacity = config["RATE_LIMIT_CAPACITY"]
    return capacity, config["RATE_LIMIT_REFILL_PER_MINUTE"] / 60.0


def _decision(allowed, tokens, capacity, rate, now):
    return Decision(
        allowed=allowed,
        capacity=capacity,
        remaining=int(math.floor(tokens)),
        reset_at=int(math.ceil(now + (capacity - tokens) / rate)),
        retry_after=0 if allowed else max(1, int(math.ceil((1 - tokens) / rate))),
    )


class RedisBucket:
    def __init__(self, url, socket_timeout):
        self.client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self.script = self.client.register_script(TOKEN_BUCKET_LUA)

    def take(self, owner):
        capacity, rate = _settings()
        try:
            allowed, tokens = self.script(keys=[KEY_PREFIX + owner], args=[capacity, rate])
        except redis.RedisError as exc:
            raise StoreUnavailable(type(exc).__name__) from exc
        return _decision(bool(allowed), float(tokens), capacity, rate, time.time())

    def available(self):
        try:
            return bool(self.client.ping())
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
    def take(self, owner):
        capacity, rate = _settings()
        now = time.time()
        params = {"bucket": owner, "now": now, "rate": rate, "capacity": capacity}
        tokens = db.session.execute(_TAKE_SQL, params).scalar()
        if tokens is None:
            # No row yet, or an empty bucket: create it full (a no-op if it exists), try again.
            db.session.execute(
                upsert_insert(RateBucket)
                .values(bucket=owner, tokens=capacity, updated_at=now)
                .on_conflict_do_nothing()
            )
            tokens = db.session.execute(_TAKE_SQL, params).scalar()
        if tokens is None:
            state = db.session.execute(
                select(RateBucket.tokens, RateBucket.updated_at).where(RateBucket.bucket == owner)
            ).one()
            db.session.commit()
            left = min(capacity, state.tokens + (now - state.updated_at) * rate)
            return _decision(False, left, capacity, rate, now)
        # Committed at once: the token is spent even if the request fails later.
        db.session.commit()
        return _decision(True, tokens, capacity, rate, now)

    def available(self):
        return True


def init_app(app):
    if app.config["REDIS_URL"]:
        app.extensions["rate_bucket"] = RedisBucket(
            app.config["REDIS_URL"], app.config["REDIS_SOCKET_TIMEOUT"]
        )
    else:
        app.extensions["rate_bucket"] = DatabaseBucket()


def take(owner):
    return current_app.extensions["rate_bucket"].take(owner)


def store_available():
    return current_app.extensions["rate_bucket"].available()
