"""Request-rate enforcement and the X-RateLimit-* headers on every /v1/* response."""
import logging
import math
import time

import redis
from flask import current_app, g, request
from limits import parse

from app.errors import TooManyRequests, Unavailable
from app.extensions import limiter
from app.traffic import bucket
from app.traffic.addresses import client_address

log = logging.getLogger(__name__)

# Fail-open bookkeeping is per process on purpose: it only bounds how long this worker
# lets requests through unmetered, it enforces nothing.
_outage = {"since": None}


def take_request_token(principal):
    """Spend one token of the caller's bucket, or raise the contract's 429."""
    try:
        decision = bucket.take(principal.owner)
    except bucket.StoreUnavailable as exc:
        _store_down(exc)
        return
    _outage["since"] = None
    g.rate_decision = decision
    if not decision.allowed:
        raise TooManyRequests("rate limit exceeded", retry_after=decision.retry_after)


def _store_down(exc):
    config = current_app.config
    log.error("rate-limit store unavailable", extra={"failure": str(exc)})
    if config["RATE_LIMIT_STORE_FAILURE"] == "open":
        since = _outage["since"] = _outage["since"] or time.monotonic()
        if time.monotonic() - since <= config["RATE_LIMIT_FAIL_OPEN_SECONDS"]:
            return
    raise Unavailable("rate limit store unavailable", headers={"Retry-After": "1"})


def record_failed_authentication():
    """Count a failed authentication against the client address (a moving window in the
    storage Flask-Limiter is configured with); past the limit the answer is 429, not 401.

    Only failures are counted or checked, so a valid request costs no extra round trip and
    keys still cannot be guessed at speed."""
    item = parse(current_app.config["AUTH_FAILURE_LIMIT"])
    identity = ("failed-authentication", client_address())
    try:
        allowed = limiter.limiter.hit(item, *identity)
        stats = limiter.limiter.get_window_stats(item, *identity)
    except redis.RedisError as exc:
        log.error("rate-limit store unavailable", extra={"failure": type(exc).__name__})
        return  # the 401 still stands; only the guessing limit is lost while Redis is down
    g.rate_decision = bucket.Decision(allowed, item.amount, stats.remaining, int(stats.reset_time),
                                      0)
    if not allowed:
        raise TooManyRequests("rate limit exceeded",
                              retry_after=max(1, math.ceil(stats.reset_time - time.time())))


def _rate_headers(response):
    decision = g.get("rate_decision")
    if decision is None or not request.path.startswith("/v1/"):
        return response
    response.headers["X-RateLimit-Limit"] = str(decision.capacity)
    response.headers["X-RateLimit-Remaining"] = str(max(decision.remaining, 0))
    response.headers["X-RateLimit-Reset"] = str(decision.reset_at)
    return response


def _forget_decision():
    # g outlives a request when an app context was already pushed (tests, CLI): start clean.
    g.pop("rate_decision", None)


def init_app(app):
    bucket.init_app(app)
    app.before_request(_forget_decision)
    app.after_request(_rate_headers)
