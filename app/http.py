"""Request plumbing shared by every endpoint: request ids and strict JSON bodies."""
import re
import time
import uuid

from flask import current_app, g, request
from gunicorn.http.errors import NoMoreData, ParseException
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from app import strict_json
from app.errors import BadRequest, NotFound, NotImplementedCoding, UnsupportedMediaType
from app.logs import mask_credentials
from app.schemas import RequestSchema

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
UNSUPPORTED_CODING = "transfer coding not supported"
INCOMPLETE_BODY = "request body is incomplete: the connection ended before all of it arrived"
# The transfer codings of a body the app reads (gunicorn takes chunked framing apart).
FRAMINGS = frozenset(("chunked", "identity"))
_NO_FIELDS = RequestSchema()


def json_body(allow_empty=False):
    """Return the request body as a dict, or raise the contract's 4xx for anything else.
    Parsed once per request: the view may read again what its schema loaded (verify digests
    the body as sent)."""
    state = g._get_current_object()  # each proxy looked through once: on every request
    body = state.get("json_body")
    if body is None:
        body = state.json_body = _parse_body(request._get_current_object(), state, allow_empty)
    return body


def no_body():
    """For a view that takes no body (a GET, a DELETE): none, an empty one or {} is fine; any
    other is refused as a body with fields the view does not take is anywhere (400 naming
    them, 413 past the limit, 400 for what is not JSON), rather than passed over unread."""
    _NO_FIELDS.load(json_body(allow_empty=True))


def _parse_body(asked, state, allow_empty):
    raw = _body_bytes(asked, state)
    if allow_empty and not raw:
        return {}
    # application/json itself: not any +json type, whose rules (a JSON patch, say) are not ours.
    if asked.mimetype != "application/json":
        raise BadRequest("Content-Type must be application/json")
    charset = asked.mimetype_params.get("charset")
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise BadRequest(strict_json.NOT_UTF8)
    if asked.headers.get("Content-Encoding", "identity").lower() != "identity":
        raise UnsupportedMediaType("Content-Encoding is not supported: send the body uncompressed",
                                   headers={"Accept-Encoding": "identity"})
    _refuse_compressed_transfer(asked.environ.get("HTTP_TRANSFER_ENCODING"))
    body = strict_json.loads(raw)
    if not isinstance(body, dict):
        raise BadRequest(strict_json.NOT_AN_OBJECT)
    return body


def _refuse_compressed_transfer(codings):
    """501, as gunicorn answers a transfer coding it does not know, for a body compressed in
    transit: gunicorn takes chunked framing apart itself, but passes a compression before it
    ("gzip, chunked") on to the app as it came. Whatever the bytes: a body labelled compressed
    that happens to parse as JSON is not read as if the label were not there."""
    if codings and not FRAMINGS.issuperset(
            coding.strip(" \t").lower() for coding in codings.split(",")):
        raise NotImplementedCoding(UNSUPPORTED_CODING)


def _body_bytes(asked, state):
    """The whole body, at most MAX_CONTENT_LENGTH bytes however it was framed. Read once per
    request, and its outcome kept, the bytes or the refusal: a view run again in the same
    request (app.auth, on a fresh lookup) reads what the first run read. The stream is spent
    by then, so a second reading would take what came before a chunked framing error, or a
    body cut at the limit, for the whole body."""
    outcome = state.get("body_outcome")
    if outcome is None:
        try:
            outcome = _read_body(asked)
        except (BadRequest, RequestEntityTooLarge) as refusal:
            outcome = refusal
        state.body_outcome = outcome
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _read_body(asked):
    try:
        raw = asked.get_data(cache=True)
        # Werkzeug stops a chunked body (no Content-Length) at the limit without a word; one
        # more byte from the server's stream tells a body cut short from one exactly that long.
        expected = asked.content_length
        if expected is None:
            limit = asked.max_content_length
            if limit is not None and len(raw) >= limit and asked.environ["wsgi.input"].read(1):
                raise RequestEntityTooLarge()
        elif len(raw) < expected:
            # gunicorn hands over what came before the client closed its side of the connection
            # (Werkzeug trusts it to end the stream where the body ends): a cut body may still
            # parse, and must not be served as if it were whole.
            raise BadRequest(INCOMPLETE_BODY)
    except ParseException:
        # gunicorn parses chunked framing lazily, while the app reads: a malformed chunk size
        # or terminator surfaces here.
        raise BadRequest("request body has malformed chunked encoding") from None
    except (NoMoreData, ClientDisconnected):
        # The connection ended inside a chunked body (gunicorn's NoMoreData, which Werkzeug's
        # stream, bounding the read at the limit, turns into ClientDisconnected).
        raise BadRequest(INCOMPLETE_BODY) from None
    return raw


def assign_request_id():
    supplied = request.headers.get("X-Request-Id", "")
    state = g._get_current_object()  # the proxy looked through once
    state.request_id = supplied if acceptable_request_id(supplied) else uuid.uuid4().hex
    state.request_started = time.perf_counter()  # also read by app.metrics


def refuse_leading_slashes():
    """Paths are matched as sent (docs/api.md): werkzeug strips the slashes a path starts with
    (request.path and routing alike), so "//v1/tenant/usage" would be served as
    "/v1/tenant/usage", where "/v1//tenant/usage" is not found."""
    if request.environ.get("PATH_INFO", "").startswith("//"):
        raise NotFound("not found")


def acceptable_request_id(supplied):
    """The caller's id fits the pattern and holds no key or secret: it is written into every
    log line and audit entry of the request (and so into audit webhooks), none of which may
    ever hold one. A key_live_... id (a client sending its key in the wrong header) is
    replaced like any other id the service does not take."""
    return REQUEST_ID_PATTERN.fullmatch(supplied) is not None and (
        mask_credentials(supplied) == supplied)


def protective_headers(response):
    """CONTRACT.md's headers on every response. API answers are never cached: some carry
    credentials (provisioning, rotation), and none is meant to be reused."""
    # add, not set: only these hooks write these headers (set would scan the list each time).
    headers = response.headers
    headers.add("X-Request-Id", g.get("request_id") or uuid.uuid4().hex)
    headers.add("X-Content-Type-Options", "nosniff")
    if request.path.startswith("/v1/"):
        headers.add("Cache-Control", "no-store")
        if current_app.config["CORS_ORIGINS"]:
            # CORS answers depend on the Origin even when this one carries no CORS header.
            response.vary.add("Origin")
    return response
