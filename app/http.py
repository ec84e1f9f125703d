"""Request plumbing shared by every endpoint: request ids and strict JSON bodies."""
import logging
import re
import time
import uuid

from flask import g, request

from app.errors import BadRequest

log = logging.getLogger("app.access")

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")


def json_body(allow_empty=False):
    """Return the request body as a dict, or raise the contract's 400 for anything else."""
    if allow_empty and not request.get_data(cache=True):
        return {}
    if not request.is_json:
        raise BadRequest("Content-Type must be application/json")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _assign_request_id():
    supplied = request.headers.get("X-Request-Id", "")
    g.request_id = supplied if REQUEST_ID_PATTERN.fullmatch(supplied) else uuid.uuid4().hex
    g.request_started = time.perf_counter()  # also read by app.metrics


def _stamp_request_id(response):
    response.headers["X-Request-Id"] = g.get("request_id") or uuid.uuid4().hex
    return response


def _log_request(response):
    elapsed_ms = (time.perf_counter() - g.get("request_started", time.perf_counter())) * 1000
    # The path, never the query string: keys must not travel in URLs, and if a client puts one
    # there anyway it must not reach the log.
    log.info(
        "request",
        extra={
            "method": request.method,
            "path": request.path,
            "status": response.status_code,
            "duration_ms": round(elapsed_ms, 2),
        },
    )
    return response


def init_app(app):
    app.before_request(_assign_request_id)
    app.after_request(_log_request)
    app.after_request(_stamp_request_id)
