"""Request-rate enforcement and the X-RateLimit-* headers on every /v1/* response."""
import logging
import time

from flask import current_app, g, request

from app.errors import TooManyRequests, Unavailable
from app.extensions import limiter
from app.traffic import bucket

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


def _rate_headers(response):
    if not request.path.startswith("/v1/"):
        return response
    decision = g.get("rate_decision")
    if decision is not None:
        limit, remaining, reset_at = decision.capacity, decision.remaining, decision.reset_at
    else:
        # No bucket was consulted (no valid key): show the per-address limit on failed auth.
        current = limiter.current_limit
        if current is None:
            return response
        limit, remaining, reset_at = current.limit.amount, current.remaining, current.reset_at
    response.headers["X-RateLimit-Limit"] = str(limit)
    response.headers["X-RateLimit-Remaining"] = str(max(remaining, 0))
    response.headers["X-RateLimit-Reset"] = str(int(reset_at))
    return response


def auth_failed(response):
    """Flask-Limiter deducts from the per-address limit only for failed authentication."""
    return response.status_code == 401


def limit_failed_authentication(blueprint):
    """Apply the per-address limit on failed authentication to every view of a blueprint."""
    limiter.shared_limit(
        lambda: current_app.config["AUTH_FAILURE_LIMIT"],
        scope="failed-authentication",
        deduct_when=auth_failed,
        error_message="rate limit exceeded",
    )(blueprint)


def _forget_decision():
    # g outlives a request when an app context was already pushed (tests, CLI): start clean.
    g.pop("rate_decision", None)


def init_app(app):
    bucket.init_app(app)
    app.before_request(_forget_decision)
    app.after_request(_rate_headers)
