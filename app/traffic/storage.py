"""The embedded setup's rate-limit storage: token buckets in the app's database, shared by every
worker, registered with `limits` under the scheme `intentgate+database://` (what the limiter
uses when REDIS_URL is not set). It serves the token-bucket strategy only.

One row per bucket, each step one self-contained statement: a conditional UPDATE takes a token
(refill included) or matches nothing, so no two workers can spend the same token.
"""
import hashlib
import time

from limits.storage import Storage
from sqlalchemy import bindparam, delete, select, text

from app import database
from app.traffic.models import RateBucket

SCHEME = "intentgate+database"

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


class DatabaseStorage(Storage):
    STORAGE_SCHEME = [SCHEME]

    def __init__(self, uri=None, wrap_exceptions=False, **options):
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)

    @property
    def base_exceptions(self):
        # The database's own failure is its own 503 (app.database), not a store outage.
        return ()

    def take_token(self, key, capacity, rate):
        now = time.time()
        params = {"bucket": _row_name(key), "now": now, "rate": rate, "capacity": capacity}
        row = database.first("bucket_take", lambda: _TAKE_SQL, params)
        if row is None:
            # No row yet, or an empty bucket: create it full (a no-op if it exists), try again.
            database.execute("bucket_create", _create_bucket, params)
            row = database.first("bucket_take", lambda: _TAKE_SQL, params)
        if row is not None:
            return True, row.tokens
        return False, self._left(params["bucket"], capacity, rate, now)

    def peek_tokens(self, key, capacity, rate):
        return self._left(_row_name(key), capacity, rate, time.time())

    @staticmethod
    def _left(bucket, capacity, rate, now):
        state = database.first("bucket_state", _bucket_state, {"bucket": bucket})
        if state is None:  # a bucket not made yet is full
            return capacity
        return min(capacity, state.tokens + (now - state.updated_at) * rate)

    def clear(self, key):
        database.execute("bucket_clear", _clear_bucket, {"bucket": _row_name(key)})

    def reset(self):
        database.execute("bucket_reset", lambda: delete(RateBucket.__table__), {})

    def check(self):
        return True  # it is the database: /health checks that already

    # Counters of the window strategies: not kept here.
    def incr(self, key, expiry, amount=1):
        raise NotImplementedError("the database storage keeps token buckets only")

    def get(self, key):
        raise NotImplementedError("the database storage keeps token buckets only")

    def get_expiry(self, key):
        raise NotImplementedError("the database storage keeps token buckets only")


def _row_name(key):
    """The bucket's row name: its key, or for a key longer than the column (an IPv6 address
    with the limit's own parts) the key's SHA-256, the same in every worker."""
    return key if len(key) <= 64 else hashlib.sha256(key.encode()).hexdigest()


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


def _clear_bucket():
    buckets = RateBucket.__table__
    return delete(buckets).where(buckets.c.bucket == bindparam("bucket"))
