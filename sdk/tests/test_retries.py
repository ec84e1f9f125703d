"""Retries against a real HTTP server that fails on purpose (pytest-httpserver, raw sockets)."""
import json
import re
import socket
import ssl
import threading

import pytest
import requests
from werkzeug import Response

from intentgate import (
    AuthenticationError,
    Blocked,
    Client,
    IntentGateError,
    QuotaExceededError,
    RateLimitError,
    ScaleResponse,
    ServiceError,
    ValidationError,
)

KEY = "key_live_" + "a" * 48
USAGE = {"email": "t@example.com", "plan": "free", "usage_count": 1, "rate_limit": 1000,
         "remaining": 999}


class Sleeps(list):
    def __call__(self, seconds):
        self.append(seconds)


def _client(httpserver, sleeps, fraction=lambda: 1.0, **kwargs):
    return Client(httpserver.url_for(""), KEY, timeout=2, sleep=sleeps, random_fraction=fraction,
                  **kwargs)


def _error(status, text, **headers):
    return Response(f'{{"error": "{text}", "request_id": "rid-{status}"}}', status=status,
                    content_type="application/json", headers=headers)


def test_503_twice_then_200_succeeds(httpserver):
    for _ in range(2):
        httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_response(
            _error(503, "service temporarily unavailable"))
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_json(USAGE)
    sleeps = Sleeps()
    usage = _client(httpserver, sleeps).usage()
    assert usage.remaining == 999 and len(httpserver.log) == 3
    assert sleeps == [0.5, 1.0]


def test_503_four_times_fails_after_exactly_four_attempts(httpserver):
    httpserver.expect_request("/v1/tenant/usage").respond_with_response(
        _error(503, "service temporarily unavailable"))
    sleeps = Sleeps()
    with pytest.raises(ServiceError) as raised:
        _client(httpserver, sleeps).usage()
    assert len(httpserver.log) == 4
    assert raised.value.status == 503 and raised.value.request_id == "rid-503"
    assert sleeps == [0.5, 1.0, 2.0]  # the ceiling doubles each time


def test_backoff_is_jittered_below_a_growing_ceiling(httpserver):
    httpserver.expect_request("/v1/tenant/usage").respond_with_response(_error(500, "boom"))
    runs = []
    for _ in range(5):
        sleeps = Sleeps()
        with pytest.raises(ServiceError):
            Client(httpserver.url_for(""), KEY, sleep=sleeps).usage()
        assert all(0 <= delay <= ceiling for delay, ceiling in zip(sleeps, [0.5, 1.0, 2.0]))
        runs.append(tuple(sleeps))
    assert len(set(runs)) > 1, "delays should differ between runs (full jitter)"


def test_retry_after_is_honoured(httpserver):
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_response(
        _error(503, "rate limit store unavailable", **{"Retry-After": "3"}))
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_json(USAGE)
    sleeps = Sleeps()
    _client(httpserver, sleeps).usage()
    assert sleeps == [3]


@pytest.mark.parametrize("status, text, error", [
    (400, "token too short", ValidationError),
    (401, "invalid or missing X-Service-Key", AuthenticationError),
    (403, "this endpoint requires a tenant key", AuthenticationError),
    (422, "Idempotency-Key was already used with a different request body", ValidationError),
    (429, "rate limit exceeded", RateLimitError),
    (429, "monthly verification limit reached", QuotaExceededError),
])
def test_4xx_is_tried_once_and_typed(httpserver, status, text, error):
    httpserver.expect_request("/v1/intent/generate").respond_with_response(
        _error(status, text, **{"Retry-After": "7"}))
    sleeps = Sleeps()
    with pytest.raises(error) as raised:
        _client(httpserver, sleeps).generate("user-token-123")
    assert len(httpserver.log) == 1 and sleeps == []
    assert raised.value.message == text and raised.value.request_id == f"rid-{status}"
    if status == 429:
        assert raised.value.retry_after == 7


def test_network_failures_are_retried_then_raised():
    sleeps = Sleeps()
    client = Client("http://127.0.0.1:9", KEY, timeout=1, sleep=sleeps, random_fraction=lambda: 1.0)
    with pytest.raises(ServiceError, match="network failure"):
        client.usage()
    assert sleeps == [0.5, 1.0, 2.0]


def test_verify_retries_with_one_idempotency_key(httpserver):
    httpserver.expect_ordered_request("/v1/intent/verify").respond_with_response(
        _error(502, "bad gateway"))
    httpserver.expect_ordered_request("/v1/intent/verify").respond_with_json(
        {"cleared": True, "reason": None, "payload": {"a": 1}},
        headers={"Idempotent-Replayed": "true"})
    result = _client(httpserver, Sleeps()).verify("sha256:" + "a" * 64, {"match_id": "m"})
    keys = {request.headers["Idempotency-Key"] for request, _ in httpserver.log}
    assert len(keys) == 1 and result.cleared and result.replayed


def test_rotate_key_is_not_retried_once_sent(httpserver):
    httpserver.expect_request("/v1/tenant/rotate-key").respond_with_response(_error(500, "boom"))
    with pytest.raises(ServiceError):
        _client(httpserver, Sleeps()).rotate_key()
    assert len(httpserver.log) == 1


def test_guard_returns_the_payload_or_raises_blocked(httpserver):
    intent = {"intent_hash": "sha256:" + "b" * 64, "intent_class": "other", "expires_at": 2}
    httpserver.expect_request("/v1/intent/generate").respond_with_json(intent)
    httpserver.expect_oneshot_request("/v1/intent/verify").respond_with_json(
        {"cleared": True, "reason": None, "payload": {"answer": "ok"}})
    httpserver.expect_oneshot_request("/v1/intent/verify").respond_with_json(
        {"cleared": False, "reason": "InvalidSignature", "payload": None},
        headers={"X-Request-Id": "rid-blocked"})
    seen = []

    def call_ai(intent_hash):
        seen.append(intent_hash)
        return ScaleResponse.sign("sig_live_" + "0" * 64, intent_hash, {"answer": "ok"})

    client = _client(httpserver, Sleeps())
    assert client.guard("user-token-123", call_ai) == {"answer": "ok"}
    with pytest.raises(Blocked) as blocked:
        client.guard("user-token-123", call_ai)
    assert blocked.value.reason == "InvalidSignature"
    assert blocked.value.request_id == "rid-blocked"  # to quote, as with any error
    assert str(blocked.value) == "AI response blocked: InvalidSignature (request rid-blocked)"
    assert seen == [intent["intent_hash"]] * 2


class RawServer:
    """Accepts connections on 127.0.0.1, reads each request, then answers `reply` (bytes, maybe
    empty) and closes. Counts the connections; stops when told to, or after 30 s."""

    def __init__(self, reply):
        self.reply = reply
        self.connections = 0
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)  # how often the accept loop looks at `stopping`
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        with self.listener:
            for _ in range(300):
                if self.stopping.is_set():
                    return
                try:
                    connection, _ = self.listener.accept()
                except TimeoutError:
                    continue
                self._answer(connection)

    def _answer(self, connection):
        with connection:
            self.connections += 1
            connection.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                request += chunk
            connection.sendall(self.reply)

    def close(self):
        self.stopping.set()
        self.thread.join(timeout=10)


@pytest.fixture
def raw_server():
    servers = []

    def start(reply):
        servers.append(RawServer(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def closed_port():
    """A port bound but never listening: connecting to it is refused, and nothing else can
    take it while the test runs."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


def _raw_client(url, sleeps):
    return Client(url, KEY, timeout=5, sleep=sleeps, random_fraction=lambda: 1.0)


def test_a_refused_connection_was_not_sent_so_even_rotate_key_is_retried(closed_port):
    sleeps = Sleeps()
    client = _raw_client(f"http://127.0.0.1:{closed_port}", sleeps)
    with pytest.raises(ServiceError, match="network failure: ConnectionError") as raised:
        client.rotate_key()
    assert sleeps == [0.5, 1.0, 2.0] and raised.value.maybe_sent is False
    assert client.api_key == KEY


def test_a_dropped_request_may_have_been_sent_so_rotate_key_is_not_retried(raw_server):
    server = raw_server(b"")  # reads the request, then closes without an answer
    sleeps = Sleeps()
    with pytest.raises(ServiceError, match="network failure: ConnectionError") as raised:
        _raw_client(server.url, sleeps).rotate_key()
    assert server.connections == 1 and sleeps == [] and raised.value.maybe_sent is True
    with pytest.raises(ServiceError):
        _raw_client(server.url, sleeps).usage()  # a read is safe to retry
    assert server.connections == 1 + 4 and sleeps == [0.5, 1.0, 2.0]


def test_what_the_error_text_says_does_not_decide(raw_server):
    # The request arrived; the answer is garbage whose text reads like a refused connection.
    # Only the exception's type may say whether the request was sent.
    server = raw_server(b"Connection refused: failed to establish a new connection\r\n")
    with pytest.raises(ServiceError) as raised:
        _raw_client(server.url, Sleeps()).rotate_key()
    assert server.connections == 1 and raised.value.maybe_sent is True


def test_a_5xx_was_sent(httpserver):
    httpserver.expect_request("/v1/tenant/rotate-key").respond_with_response(_error(503, "down"))
    with pytest.raises(ServiceError) as raised:
        _client(httpserver, Sleeps()).rotate_key()
    assert raised.value.maybe_sent is True and raised.value.status == 503


def test_a_private_ca_is_trusted_through_verify(tmp_path):
    trustme = pytest.importorskip("trustme")
    from pytest_httpserver import HTTPServer

    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = HTTPServer(host="127.0.0.1", port=0, ssl_context=context)
    server.expect_request("/v1/tenant/usage").respond_with_json(USAGE)
    server.start()
    try:
        bundle = tmp_path / "private-ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        url = server.url_for("").rstrip("/")
        assert Client(url, KEY, verify=str(bundle)).usage().remaining == 999
        with pytest.raises(ServiceError, match="network failure: SSLError"):
            Client(url, KEY, max_retries=0).usage()  # the system's CAs do not know this one
    finally:
        server.clear()
        server.stop()


@pytest.mark.parametrize("call", [
    lambda client: client.generate("user-token-123", ttl=float("inf")),
    lambda client: client.verify("sha256:" + "a" * 64, {"match_id": "m", "timestamp": 1,
                                                         "payload": {"x": float("nan")},
                                                         "signature": "00"}),
    lambda client: client.create_key({"a", "set"}),
])
def test_a_body_without_a_json_form_is_refused_before_anything_is_sent(httpserver, call):
    with pytest.raises(ValidationError, match="request body cannot be sent as JSON"):
        call(_client(httpserver, Sleeps()))
    assert len(httpserver.log) == 0


@pytest.mark.parametrize("api_key", [KEY + "\n", KEY + "\r\n", " " + KEY, "\n" + KEY, "",
                                     "key_live_\u00e9", None])
def test_a_key_no_header_can_carry_is_refused_without_quoting_it(api_key):
    """A key read from a file with its line break: requests would raise InvalidHeader with the
    whole key in its text, which ends up in logs and error trackers."""
    with pytest.raises(ValidationError) as raised:
        Client("http://127.0.0.1:9", api_key)
    assert str(raised.value) == "api_key must be a non-empty string of printable ASCII"
    assert "key_live_" not in repr(raised.value) and raised.value.__cause__ is None


@pytest.mark.parametrize("body", ["<html>a proxy's page</html>", "[1, 2]", ""])
def test_a_success_status_without_a_json_object_is_a_service_error(httpserver, body):
    """Not a KeyError where the caller reads a field: every error of Client is IntentGateError."""
    httpserver.expect_request("/v1/intent/generate").respond_with_data(
        body, status=200, content_type="text/html", headers={"X-Request-Id": "rid-proxy"})
    with pytest.raises(ServiceError) as failed:
        _client(httpserver, Sleeps()).generate("sdk-user-token")
    assert failed.value.message == "the service answered 200 without a JSON object"
    assert (failed.value.status, failed.value.request_id) == (200, "rid-proxy")


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "text/html",
                                          "application/json; charset=iso-8859-1"])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["no-bom", "bom"])
def test_a_cleared_payload_is_read_as_utf_8_whatever_the_content_type_says(httpserver,
                                                                           content_type, bom):
    """JSON is UTF-8 (RFC 8259): read as the charset a proxy's Content-Type names (or as
    requests reads text/*, ISO-8859-1), the payload's text would not be what was signed."""
    payload = {"answer": "caf\u00e9 \u2013 \U0001f600"}
    body = json.dumps({"cleared": True, "reason": None, "payload": payload},
                      ensure_ascii=False).encode("utf-8")
    httpserver.expect_request("/v1/intent/verify").respond_with_data(
        bom + body, status=200, content_type=content_type)
    assert _client(httpserver, Sleeps()).verify("sha256:" + "a" * 64, {}).payload == payload


@pytest.mark.parametrize("reply", [
    # Cut off short of its Content-Length, and short of its last chunk.
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 90\r\n\r\n{"cleared"',
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'9\r\n{"cleared"\r\n',
], ids=["content-length", "chunked"])
def test_an_answer_cut_off_mid_body_is_a_network_failure_and_retried(raw_server, reply):
    """The lost answer that verify's retries exist for, not requests' ChunkedEncodingError."""
    server = raw_server(reply)
    sleeps = Sleeps()
    with pytest.raises(ServiceError, match="network failure: ChunkedEncodingError") as raised:
        _raw_client(server.url, sleeps).verify("sha256:" + "a" * 64, {"match_id": "m"})
    assert server.connections == 4 and sleeps == [0.5, 1.0, 2.0]
    assert raised.value.maybe_sent is True
    with pytest.raises(ServiceError):
        _raw_client(server.url, sleeps).rotate_key()  # it may have rotated: not retried
    assert server.connections == 5


@pytest.mark.parametrize("value", ["\u00b2", "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT", "soon"])
def test_a_retry_after_that_is_not_delay_seconds_is_ignored(httpserver, value):
    """Never a ValueError from int(): '²' (Latin-1 0xB2) passes str.isdigit()."""
    httpserver.expect_request("/v1/intent/generate").respond_with_response(
        _error(429, "rate limit exceeded", **{"Retry-After": value}))
    with pytest.raises(RateLimitError) as raised:
        _client(httpserver, Sleeps()).generate("user-token-123")
    assert raised.value.retry_after is None and raised.value.request_id == "rid-429"
    httpserver.clear()
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_response(
        _error(503, "busy", **{"Retry-After": value}))
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_json(USAGE)
    sleeps = Sleeps()
    assert _client(httpserver, sleeps).usage().remaining == 999
    assert sleeps == [0.5]  # the backoff's own wait


def test_a_retry_after_beyond_a_minute_is_not_waited_for(httpserver):
    """Honoured means never sooner; a 5xx asking for hours (or for ever) is raised at once."""
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_response(
        _error(503, "busy", **{"Retry-After": "60"}))
    httpserver.expect_ordered_request("/v1/tenant/usage").respond_with_response(
        _error(503, "busy", **{"Retry-After": "99999999999"}))
    sleeps = Sleeps()
    with pytest.raises(ServiceError) as raised:
        _client(httpserver, sleeps).usage()
    assert sleeps == [60] and len(httpserver.log) == 2
    assert (raised.value.status, raised.value.request_id) == (503, "rid-503")


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_so_the_key_goes_nowhere_else(raw_server, status):
    elsewhere = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    server = raw_server(f"HTTP/1.1 {status} Moved\r\nLocation: {elsewhere.url}/collect\r\n"
                        "X-Request-Id: rid-proxy\r\nContent-Length: 0\r\n\r\n".encode())
    with pytest.raises(IntentGateError) as raised:
        _raw_client(server.url, Sleeps()).generate("user-token-123")
    assert (raised.value.status, raised.value.request_id) == (status, "rid-proxy")
    assert "redirect" in raised.value.message
    assert server.connections == 1 and elsewhere.connections == 0


@pytest.mark.parametrize("status, error", [(200, ServiceError), (500, ServiceError),
                                           (400, ValidationError)])
def test_an_answer_nested_too_deeply_to_parse_is_not_a_recursion_error(httpserver, status, error):
    httpserver.expect_request("/v1/intent/generate").respond_with_data(
        "[" * 100_000 + "]" * 100_000, status=status, content_type="application/json",
        headers={"X-Request-Id": "rid-deep"})
    with pytest.raises(error) as raised:
        _client(httpserver, Sleeps()).generate("user-token-123")
    assert (raised.value.status, raised.value.request_id) == (status, "rid-deep")


@pytest.mark.parametrize("path, call", [
    ("/v1/intent/generate", lambda client: client.generate("user-token-123")),
    ("/v1/intent/verify", lambda client: client.verify("sha256:" + "a" * 64, {"match_id": "m"})),
    ("/v1/tenant/usage", lambda client: client.usage()),
    ("/v1/tenant/rotate-key", lambda client: client.rotate_key()),
    ("/v1/tenant/keys", lambda client: client.list_keys()),
])
def test_a_json_object_that_is_not_the_answer_is_a_service_error(httpserver, path, call):
    """A proxy's `{}` with a 200: not a KeyError, and never a rotated key taken from nowhere."""
    httpserver.expect_request(path).respond_with_json({"status": "ok"},
                                                      headers={"X-Request-Id": "rid-proxy"})
    client = _client(httpserver, Sleeps())
    with pytest.raises(ServiceError, match="the service answered 200 without ") as raised:
        call(client)
    assert (raised.value.status, raised.value.request_id) == (200, "rid-proxy")
    assert client.api_key == KEY


@pytest.mark.parametrize("path, member, call", [
    ("/v1/tenant/keys", "keys", lambda client: client.list_keys()),
    ("/v1/tenant/signing-keys", "signing_keys", lambda client: client.list_signing_keys()),
    ("/v1/tenant/audit-log", "entries", lambda client: client.audit_log()),
    ("/v1/tenant/usage/daily", "days", lambda client: client.daily_usage()),
])
@pytest.mark.parametrize("records", ["abc", None, {"id": 1}, [1, 2]])
def test_a_list_that_is_not_a_list_of_records_is_a_service_error(httpserver, path, member, call,
                                                                   records):
    """Not a string or None handed back as the keys, the entries or the days."""
    httpserver.expect_request(path).respond_with_json({member: records})
    with pytest.raises(ServiceError, match=f"answered 200 without a list of {member}"):
        call(_client(httpserver, Sleeps()))


@pytest.mark.parametrize("revoke, key_id, path", [
    ("revoke_key", "../signing-keys/3", "/v1/tenant/keys/..%2Fsigning-keys%2F3"),
    ("revoke_signing_key", "../keys/3", "/v1/tenant/signing-keys/..%2Fkeys%2F3"),
    ("revoke_key", "3?x=1", "/v1/tenant/keys/3%3Fx%3D1"),
    ("revoke_key", "3#x", "/v1/tenant/keys/3%23x"),
])
def test_a_key_id_is_one_path_segment_never_another_resource(httpserver, revoke, key_id, path):
    """As Node's encodeURIComponent: '../signing-keys/3' must not revoke signing key 3."""
    httpserver.expect_request(re.compile(".*")).respond_with_response(_error(404, "not found"))
    with pytest.raises(IntentGateError):
        getattr(_client(httpserver, Sleeps()), revoke)(key_id)
    assert [request.environ["REQUEST_URI"] for request, _ in httpserver.log] == [path]


@pytest.mark.parametrize("call, query", [
    (lambda client: client.audit_log(limit=5, before="9&limit=200"),
     "limit=5&before=9%26limit%3D200"),
    (lambda client: client.audit_log(before=0), "limit=50&before=0"),
    (lambda client: client.daily_usage(days="7&x=1"), "days=7%26x%3D1"),
])
def test_query_values_are_encoded_as_node_encodes_them(httpserver, call, query):
    httpserver.expect_request(re.compile(".*")).respond_with_json({"entries": [], "days": []})
    call(_client(httpserver, Sleeps()))
    assert [request.query_string.decode() for request, _ in httpserver.log] == [query]


@pytest.mark.parametrize("verdict", [
    '{"cleared": "false", "reason": null, "payload": null}',
    '{"cleared": 1, "reason": null, "payload": {"answer": "ok"}}',
    '{"cleared": true, "reason": 7, "payload": null}',
    '{"cleared": true, "reason": null, "payload": "ok"}',
    '{"cleared": true, "reason": null, "payload": {"n": NaN}}',
    # Each member of its type, not of its verdict: cleared with a reason or without a payload,
    # blocked with a payload or without a reason.
    '{"cleared": true, "reason": "InvalidSignature", "payload": null}',
    '{"cleared": true, "reason": null, "payload": null}',
    '{"cleared": false, "reason": null, "payload": {"answer": "ok"}}',
    '{"cleared": false, "reason": null, "payload": null}',
])
def test_a_verdict_not_in_the_services_shape_never_clears(httpserver, verdict):
    """A gate fails closed: "false" is truthy, and a proxy's or a hostile answer is no verdict."""
    intent = {"intent_hash": "sha256:" + "b" * 64, "intent_class": "other", "expires_at": 2}
    httpserver.expect_request("/v1/intent/generate").respond_with_json(intent)
    httpserver.expect_request("/v1/intent/verify").respond_with_data(
        verdict, content_type="application/json")
    def call_ai(intent_hash):
        return ScaleResponse.sign("sig_live_" + "0" * 64, intent_hash, {"answer": "ok"})

    with pytest.raises(ServiceError):
        _client(httpserver, Sleeps()).guard("user-token-123", call_ai)


def test_settings_requests_takes_are_still_taken():
    """requests' own forms: no limit (None, or None for the read), and a scheme a session's
    adapter serves (http+unix://) when the caller brings that session."""
    for timeout in (None, (3.05, None), (None, 27)):
        Client("http://127.0.0.1:9", KEY, timeout=timeout)
    Client("http+unix://%2Frun%2Fintentgate.sock", KEY, session=requests.Session())
    with pytest.raises(ValidationError):
        Client("http+unix://%2Frun%2Fintentgate.sock", KEY)


@pytest.mark.parametrize("kwargs", [
    {"base_url": "127.0.0.1:8000"}, {"base_url": "ftp://h"}, {"base_url": "http://"},
    {"base_url": "http://h:99999"}, {"base_url": None}, {"base_url": "http://127.0.0.1:8000\n"},
    {"base_url": " http://h"}, {"base_url": "http://h/a b"}, {"base_url": "http://u:p@h"},
    {"base_url": "http://[::1"}, {"timeout": 0}, {"timeout": -1},
    {"timeout": float("nan")}, {"timeout": (1, 0)}, {"timeout": "30"}, {"max_retries": -1},
    {"max_retries": 1.5}, {"backoff_base": -1}, {"backoff_cap": float("inf")},
])
def test_settings_no_call_could_use_are_refused_when_the_client_is_made(kwargs):
    """Refused at once, as Node's client does, rather than as requests' own exceptions at the
    first call: every error of Client is an IntentGateError."""
    settings = {"base_url": "http://127.0.0.1:9", **kwargs}
    with pytest.raises(ValidationError):
        Client(settings.pop("base_url"), KEY, **settings)


@pytest.mark.parametrize("idempotency_key", [" padded ", "a\nb", "\u00e9t\u00e9", 123])
def test_an_idempotency_key_no_header_can_carry_is_refused_before_sending(httpserver,
                                                                         idempotency_key):
    with pytest.raises(ValidationError, match="idempotency_key must be"):
        _client(httpserver, Sleeps()).verify("sha256:" + "a" * 64, {}, idempotency_key)
    assert len(httpserver.log) == 0


def test_a_payload_nested_past_pythons_stack_is_refused_before_sending(httpserver):
    payload = {}
    for _ in range(5_000):
        payload = {"x": payload}
    with pytest.raises(ValueError, match="nested too deeply"):
        ScaleResponse.sign("sig_live_" + "0" * 64, "sha256:" + "a" * 64, payload)
    with pytest.raises(ValidationError, match="nested too deeply"):
        _client(httpserver, Sleeps()).verify("sha256:" + "a" * 64, {"payload": payload})
    assert len(httpserver.log) == 0


@pytest.mark.parametrize("call, sent", [
    (lambda client: client.create_key("k", expires_in=0), {"name": "k", "expires_in": 0}),
    (lambda client: client.create_key("", scopes=[]), {"name": "", "scopes": []}),
    (lambda client: client.add_signing_key("pk", name="", expires_in=0),
     {"public_key": "pk", "name": "", "expires_in": 0}),
])
def test_zero_and_empty_are_sent_for_the_service_to_judge(httpserver, call, sent):
    """Only None leaves a member out: an expires_in of 0 dropped made a key that never expires."""
    for path in ("/v1/tenant/keys", "/v1/tenant/signing-keys"):
        httpserver.expect_request(path).respond_with_data(
            '{"error": "invalid", "request_id": "r"}', status=400,
            content_type="application/json")
    with pytest.raises(ValidationError):
        call(_client(httpserver, Sleeps()))
    assert httpserver.log[0][0].get_json() == sent
