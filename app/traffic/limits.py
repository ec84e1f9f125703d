"""Request rates through Flask-Limiter (app.extensions.limiter): the token bucket of every /v1/*
caller, and the per-address limit on failed authentication.

Both are declared once per blueprint (`declare`) and checked once a request, right after
authentication (`check`, called by app.auth): the bucket then is the caller's, and a failed
key spends only its address's failure allowance. Their storage is REDIS_URL, or without it the
app's database (app.traffic.storage), so every worker on every host shares them.
"""
import functools
import logging
import math
import time

from flask import current_app, g, request
from limits import parse

from app.errors import TooManyRequests, Unavailable
from app.extensions import limiter
from app.traffic import cluster, storage, strategy  # noqa: F401 - registered with limits at import
from app.traffic.addresses import client_network
from app.traffic.strategy import StoreUnavailable

log = logging.getLogger(__name__)

RATE_LIMITED = "rate limit exceeded"
BUCKET_SCOPE, FAILURE_SCOPE = "bucket", "failures"

# Fail-open bookkeeping is per process on purpose: it only bounds how long this worker
# lets requests through unmetered, it enforces nothing.
_outage = {"since": None}


def bucket_limit():
    """The caller's bucket as a limit: capacity tokens, refilled at the per-minute rate (an item
    of N per S seconds is a bucket of N refilling N every S seconds)."""
    config = current_app.config
    return _bucket_text(config["RATE_LIMIT_CAPACITY"], config["RATE_LIMIT_REFILL_PER_MINUTE"])


@functools.lru_cache(maxsize=16)
def _bucket_text(capacity, refill_per_minute):
    """Whole seconds where they spell the rate exactly (the default: 100 per 60 seconds), else
    microseconds (app.traffic.strategy), exact to within a microsecond a refill."""
    seconds, rest = divmod(capacity * 60, refill_per_minute)
    if not rest:
        return f"{capacity} per {seconds} seconds"
    microseconds = max(1, round(capacity * 60_000_000 / refill_per_minute))
    return f"{capacity} per {microseconds} microseconds"


def failure_limit():
    """"20 per minute" is 20 failures at once, refilled at 20 a minute."""
    return current_app.config["AUTH_FAILURE_LIMIT"]


def owner_key():
    # The braces are a hash tag: on a Redis Cluster the bucket's key names its own slot.
    return "{" + g.principal.owner + "}"


def address_key():
    return "{address:" + client_network() + "}"


def _authenticated():
    return g.get("principal") is not None


def _unauthenticated():
    return g.get("principal") is None


def _refuse(request_limit):
    raise TooManyRequests(RATE_LIMITED, retry_after=request_limit.window.retry_after)


def declare(blueprint):
    """Limit every view of `blueprint`: the caller's bucket once authenticated; the address's
    failure allowance when authentication failed (only failures are counted)."""
    limiter.shared_limit(bucket_limit, BUCKET_SCOPE, key_func=owner_key,
                         exempt_when=_unauthenticated, on_breach=_refuse)(blueprint)
    limiter.shared_limit(failure_limit, FAILURE_SCOPE, key_func=address_key,
                         exempt_when=_authenticated, on_breach=_refuse)(blueprint)


def check():
    """Spend a token of the caller's bucket, or of the address's failure allowance when no
    caller was authenticated: 429 when it is empty, before the view does anything."""
    try:
        limiter.check()
    except StoreUnavailable as exc:
        log.error("rate-limit store unavailable", extra={"failure": str(exc)})
        if _unauthenticated():
            g.rate_store_down = failure_limit()
            return  # the 401 still stands; only the guessing limit is lost while the store is down
        g.rate_store_down = bucket_limit()
        _store_down()
        return
    if _authenticated():
        _outage["since"] = None


def _store_down():
    config = current_app.config
    if config["RATE_LIMIT_STORE_FAILURE"] == "open":
        since = _outage["since"] = _outage["since"] or time.monotonic()
        if time.monotonic() - since <= config["RATE_LIMIT_FAIL_OPEN_SECONDS"]:
            return
    raise Unavailable("rate limit store unavailable", headers={"Retry-After": "1"})


def rate_headers(response):
    """X-RateLimit-* on every /v1/* response: from the bucket this request spent from, or, for
    one answered before authentication (no such endpoint or method, a CORS preflight, tenants
    switched off), from the client address's failure bucket, read without spending."""
    if not request.path.startswith("/v1/"):
        return response
    spent = limiter.current_limit
    down = g.pop("rate_store_down", None)
    if spent is not None:
        capacity, bucket = spent.limit.amount, spent.window
    else:
        item = parse(down or failure_limit())
        capacity, bucket = item.amount, None
        if down is None:
            try:
                bucket = limiter.limiter.get_window_stats(item, address_key(), FAILURE_SCOPE)
            except (StoreUnavailable, Unavailable):
                pass
    if bucket is None:
        # What the headers can truly say while the store does not answer: no token to count
        # on before the Retry-After second of the 503s has passed (rounded up, as the
        # bucket's own resets are).
        remaining, reset_at = 0, math.ceil(time.time() + 1)
    else:
        remaining, reset_at = max(bucket.remaining, 0), bucket.reset_time
    headers = response.headers  # written by this hook alone: add, no search for an earlier one
    headers.add("X-RateLimit-Limit", str(capacity))
    headers.add("X-RateLimit-Remaining", str(remaining))
    headers.add("X-RateLimit-Reset", str(reset_at))
    return response


def store_available():
    """Whether the store answers; not while the breaker is open (no call to a frozen store). A
    store that does not answer opens the breaker, as a failed bucket call does: /health then
    costs a worker one timeout, like every other request, not one a call."""
    if limiter.limiter.broken:
        return False
    return limiter.limiter.check_store()


def _forget(_exc=None):
    limiter.limiter.forget()


def init_app(app):
    """Bind the limiter to its storage; the header hook runs after Flask-Limiter's own."""
    config = app.config
    config["RATELIMIT_STRATEGY"] = "token-bucket"
    url = config["REDIS_URL"]
    if url and url.startswith(cluster.URL_SCHEME + "://"):
        url = cluster.storage_uri(url)  # its client made on first use (app.traffic.cluster)
    config["RATELIMIT_STORAGE_URI"] = url or f"{storage.SCHEME}://"
    config["RATELIMIT_STORAGE_OPTIONS"] = _storage_options(config)
    app.after_request(rate_headers)
    app.teardown_request(_forget)
    limiter.init_app(app)


def _storage_options(config):
    url = config["REDIS_URL"] or ""
    if not url:
        return {}
    timeout = config["REDIS_SOCKET_TIMEOUT"]
    timeouts = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if url.startswith("redis+cluster://"):
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # A bucket lives in its key's slot: a master that is down takes only its own slots'
        # buckets with it (require_full_coverage=False), the others keep answering. No retry:
        # the cluster client retries a timeout as it retries a refused connection, whatever
        # the Retry's errors say, and a master that does not answer cost three timeouts, not
        # one; a request whose master is gone gets the outage answer at once. A MOVED (after a
        # failover) is followed all the same.
        return {**timeouts, "require_full_coverage": False, "retry": Retry(NoBackoff(), 0)}
    if url.startswith("redis+sentinel://"):
        return {**timeouts, "sentinel_kwargs": dict(timeouts)}
    return timeouts
