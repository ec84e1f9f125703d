"""Request rates: the token bucket of every /v1/* caller, and the per-address limit on failed
authentication. Both are the one mechanism of app.traffic.bucket (Redis, or the database in the
embedded setup), so every worker on every host shares them; nothing is counted in process."""
import logging
import math
import time
from functools import wraps

from flask import current_app, g, request
from limits import parse

from app.errors import TooManyRequests, Unavailable
from app.traffic import bucket
from app.traffic.addresses import client_address

log = logging.getLogger(__name__)

RATE_LIMITED = "rate limit exceeded"

# Fail-open bookkeeping is per process on purpose: it only bounds how long this worker
# lets requests through unmetered, it enforces nothing.
_outage = {"since": None}


def rate_limited(view):
    """Spend one token of the authenticated caller's bucket (stack under @authenticate)."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        config = current_app.config
        _spend(g.principal.owner, config["RATE_LIMIT_CAPACITY"],
               config["RATE_LIMIT_REFILL_PER_MINUTE"] / 60.0)
        return view(*args, **kwargs)

    return wrapper


def count_failed_authentication():
    """Spend a token of the client address's failure bucket: past AUTH_FAILURE_LIMIT the
    answer is 429, not 401. Only failures are counted, so a valid request costs nothing here
    and keys still cannot be guessed at speed."""
    owner, capacity, rate = _failure_bucket()
    try:
        decision = bucket.take(owner, capacity, rate)
    except bucket.StoreUnavailable as exc:
        log.error("rate-limit store unavailable", extra={"failure": str(exc)})
        g.rate_decision = _while_store_down(capacity)
        return  # the 401 still stands; only the guessing limit is lost while the store is down
    _apply(decision)


def _failure_bucket():
    """(owner, capacity, refill per second) of the client address's failure bucket:
    "20 per minute" is 20 failures at once, refilled at 20 a minute."""
    item = parse(current_app.config["AUTH_FAILURE_LIMIT"])
    return "address:" + client_address(), item.amount, item.amount / item.get_expiry()


def _spend(owner, capacity, rate):
    try:
        decision = bucket.take(owner, capacity, rate)
    except bucket.StoreUnavailable as exc:
        g.rate_decision = _while_store_down(capacity)
        _store_down(exc)
        return
    _outage["since"] = None
    _apply(decision)


def _apply(decision):
    g.rate_decision = decision
    if not decision.allowed:
        raise TooManyRequests(RATE_LIMITED, retry_after=decision.retry_after)


def _store_down(exc):
    config = current_app.config
    log.error("rate-limit store unavailable", extra={"failure": str(exc)})
    if config["RATE_LIMIT_STORE_FAILURE"] == "open":
        since = _outage["since"] = _outage["since"] or time.monotonic()
        if time.monotonic() - since <= config["RATE_LIMIT_FAIL_OPEN_SECONDS"]:
            return
    raise Unavailable("rate limit store unavailable", headers={"Retry-After": "1"})


def _while_store_down(capacity):
    """What the headers can truly say while the store does not answer: the limit, and no token
    to count on before the Retry-After second of the 503s has passed. Rounded up, as the
    bucket's own resets are: a reset truncated to the second could already have passed."""
    return bucket.Decision(allowed=False, capacity=capacity, remaining=0,
                           reset_at=math.ceil(time.time() + 1), retry_after=1)


def rate_headers(response):
    """X-RateLimit-* on every /v1/* response: from the bucket this request spent from, or, for
    one answered before authentication (no such endpoint or method, a CORS preflight, tenants
    switched off), from the client address's failure bucket, read without spending."""
    decision = g.pop("rate_decision", None)
    if not request.path.startswith("/v1/"):
        return response
    if decision is None:
        owner, capacity, rate = _failure_bucket()
        try:
            decision = bucket.peek(owner, capacity, rate)
        except bucket.StoreUnavailable:
            decision = _while_store_down(capacity)
    headers = response.headers  # written by this hook alone: add, no search for an earlier one
    headers.add("X-RateLimit-Limit", str(decision.capacity))
    headers.add("X-RateLimit-Remaining", str(max(decision.remaining, 0)))
    headers.add("X-RateLimit-Reset", str(decision.reset_at))
    return response


def init_app(app):
    bucket.init_app(app)
