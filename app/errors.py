"""The one place that turns every failure into the JSON envelope of CONTRACT.md."""
import logging

from flask import current_app, g, jsonify
from marshmallow import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from werkzeug.exceptions import HTTPException

from app.config import KeyRingMismatch
from app.logs import mask_credentials

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error the client is meant to see: status, error text, optional details and headers."""

    status = 400

    def __init__(self, error, status=None, details=None, headers=None, retry_after=None):
        super().__init__(error)
        self.error = error
        if status is not None:
            self.status = status
        self.details = details
        self.headers = dict(headers or {})
        self.retry_after = retry_after
        if retry_after is not None:
            self.headers.setdefault("Retry-After", str(retry_after))


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class UnsupportedMediaType(ApiError):
    status = 415


class Unprocessable(ApiError):
    status = 422


class TooManyRequests(ApiError):
    status = 429


class NotImplementedCoding(ApiError):
    """A transfer coding the service does not decode (RFC 9112: 501)."""

    status = 501


class BadGateway(ApiError):
    status = 502


class Unavailable(ApiError):
    status = 503


def error_response(error, status, details=None, headers=None, retry_after=None):
    body = {"error": error, "request_id": g.get("request_id")}
    if details:
        body["details"] = details
    if retry_after is not None:
        body["retry_after"] = retry_after
    response = jsonify(body)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _api_error(exc):
    return error_response(exc.error, exc.status, exc.details, exc.headers, exc.retry_after)


UNKNOWN_FIELD = "unknown field"


# The client names unknown fields: what the answer repeats of its names is bounded, and a key
# or secret sent as a field name is masked (as in URLs and X-Request-Id), never echoed.
MAX_DETAILS, MAX_NAME = 10, 100


def _validation_error(exc):
    messages = _as_answered(exc.messages)
    return error_response(_first_message(messages), 400, details=_by_field(messages))


def _by_field(messages):
    """CONTRACT.md's `{"<field>": ["<message>", ...]}`: a nested object's fields named by their
    path (`response.match_id`), a list's items' messages under the list's own name, once each
    (marshmallow keys them by index: {"events": {"0": [...]}}); at most MAX_DETAILS fields."""
    fields = {}

    def add(value, path):
        if isinstance(value, dict):
            for name, inner in value.items():
                inside = not isinstance(name, str) or name == "_schema"  # an index, the object
                add(inner, path if inside else (f"{path}.{name}" if path else name))
        elif isinstance(value, list):
            for inner in value:
                add(inner, path)
        else:
            said = fields.setdefault(path or "_schema", [])
            if value not in said:
                said.append(value)

    add(messages, None)
    return dict(list(fields.items())[:MAX_DETAILS])


def _as_answered(messages):
    """marshmallow's messages with each field name masked and cut at MAX_NAME characters, and
    at most MAX_DETAILS fields a level. The unknown fields come last, in the order of their
    names (marshmallow finds them as a set: which one the error text names would vary)."""
    if isinstance(messages, dict):
        ordered = sorted(messages.items(), key=_unknown_last_by_name)
        return {_as_named(name): _as_answered(value) for name, value in ordered[:MAX_DETAILS]}
    if isinstance(messages, list):
        return [_as_answered(value) for value in messages]
    return messages


def _unknown_last_by_name(item):
    """Sort key: the fields the schema knows in marshmallow's order (a stable sort), then the
    unknown ones by name."""
    name, message = item
    unknown = message == [UNKNOWN_FIELD]
    return (unknown, str(name) if unknown else "")


def _as_named(name):
    if not isinstance(name, str):
        return name  # a list's index
    name = mask_credentials(name)
    return name if len(name) <= MAX_NAME else name[:MAX_NAME] + "..."


def _first_message(messages, path=None):
    """Pick one message as the error text; schemas word their messages to stand alone."""
    if isinstance(messages, dict):
        for name, value in messages.items():
            nested = path if name == "_schema" else (f"{path}.{name}" if path else name)
            return _first_message(value, nested)
    if isinstance(messages, list) and messages:
        return _first_message(messages[0], path)
    if messages == UNKNOWN_FIELD and path is not None:
        return f"unknown field: {path}"
    return str(messages) if messages else "invalid request"


def _http_error(exc):
    # Werkzeug's own description is fine to show; it never contains request data.
    headers = {}
    if exc.code == 405 and exc.valid_methods:
        headers["Allow"] = ", ".join(sorted(exc.valid_methods))
    texts = {
        404: "not found",
        405: "method not allowed",
        413: "request body too large (limit 64 KiB)",
        415: "Content-Type must be application/json",
    }
    error = texts.get(exc.code, (exc.name or "error").lower())
    return error_response(error, exc.code or 500, headers=headers)


def database_failure(exc, url=None):
    """Log fields for a failure of the database: its kind, and the cause in the server's or
    driver's own words (`database "x" does not exist`, `Connection refused`). Only the first
    line: never the statement, its parameters or a DETAIL line (which quotes row values), and
    never the password of DATABASE_URL."""
    original = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's exception
    cause = " ".join(next((line for line in str(original).splitlines() if line.strip()),
                          "").split())[:300]
    password = make_url(url or current_app.config["SQLALCHEMY_DATABASE_URI"]).password
    if password:
        cause = cause.replace(password, "[redacted]")
    return {"failure": type(exc).__name__, "cause": cause}


def _database_unavailable(exc):
    log.error("database unavailable", extra=database_failure(exc))
    return error_response("service temporarily unavailable", 503, headers={"Retry-After": "1"})


def _key_ring_mismatch(exc):
    # The start check found the database down; the seal that found the mismatch wrote nothing.
    log.error("secret not sealed: %s", exc)
    return error_response("service temporarily unavailable", 503)


def _unexpected(exc):
    log.exception("unhandled error")
    return error_response("internal server error", 500)


def init_app(app):
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(ValidationError, _validation_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(KeyRingMismatch, _key_ring_mismatch)
    app.register_error_handler(OperationalError, _database_unavailable)
    app.register_error_handler(InterfaceError, _database_unavailable)
    app.register_error_handler(Exception, _unexpected)
