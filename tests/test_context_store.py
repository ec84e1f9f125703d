"""The context store as a real external HTTP dependency (pytest-httpserver, raw sockets)."""
import json
import socket
import threading
import time

import pytest
import time_machine
from sqlalchemy import func, select
from werkzeug import Response

from app import create_app
from app.config import ConfigError
from app.context_store.breaker import TRIAL, Breaker
from app.extensions import db
from app.intents.models import Intent
from tests.servers import free_port
from tests.support import assert_envelope

TOKEN = "eyJhbGciOiJIUzI1NiJ9.ctx-token.signature-part"


@pytest.fixture
def store_url(httpserver, app):
    app.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    app.config["CONTEXT_STORE_READ_TIMEOUT"] = 0.5
    return app.config["CONTEXT_STORE_URL"]


def _generate(client, tenant):
    return client.post("/v1/intent/generate", headers=tenant.headers, json={"user_token": TOKEN})


def _no_intent_written(app):
    with app.app_context():
        return db.session.execute(select(func.count()).select_from(Intent)).scalar_one() == 0


def _nothing_metered(client, tenant):
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    return usage["usage_count"] == 0


def _failures(caplog):
    return [r.failure for r in caplog.records if r.getMessage() == "context store request failed"]


@pytest.mark.parametrize("tags, intent_class", [
    (["checkout", "cart"], "commerce"),
    (["kubernetes-cluster"], "infrastructure"),
    (["yoga", "sleep"], "wellness"),
    (["mortgage"], "finance"),
    (["homework"], "education"),
    (["friends-feed"], "social"),
    (["weather"], "other"),
    ([], "other"),
])
def test_tags_from_the_store_choose_the_class(client, tenant, httpserver, store_url, tags,
                                              intent_class):
    httpserver.expect_request(
        "/context", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
    ).respond_with_json({"tags": tags})
    response = _generate(client, tenant)
    assert response.status_code == 200
    assert response.get_json()["intent_class"] == intent_class
    (request, _), = httpserver.log
    assert TOKEN not in request.url and request.get_json() == {}


def _failing(httpserver, **respond):
    httpserver.expect_request("/context").respond_with_response(Response(**respond))


@pytest.mark.parametrize("respond, failure", [
    ({"response": "boom", "status": 500}, "status 500"),
    ({"response": "missing", "status": 404}, "status 404"),
    ({"response": "<html>hi</html>", "status": 200, "content_type": "text/html"}, "answer is not JSON"),
    ({"response": json.dumps({"labels": ["x"]}), "status": 200,
      "content_type": "application/json"}, "answer has no list of tags"),
    ({"response": json.dumps(["x"]), "status": 200,
      "content_type": "application/json"}, "answer has no list of tags"),
    ({"response": json.dumps({"tags": [1, 2]}), "status": 200,
      "content_type": "application/json"}, "answer has a tag that is not a short string"),
])
def test_store_failures_are_502_and_write_nothing(client, tenant, httpserver, store_url, caplog,
                                                  respond, failure):
    _failing(httpserver, **respond)
    response = _generate(client, tenant)
    assert_envelope(response, 502, "context store request failed")
    assert _no_intent_written(client.application)
    records = [r for r in caplog.records if r.getMessage() == "context store request failed"]
    assert records and records[-1].failure == failure
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_502_and_not_followed(client, tenant, httpserver, store_url, caplog, status):
    # Following it would send the user's token to wherever the store points, and use its answer.
    httpserver.expect_request("/context").respond_with_response(
        Response(status=status, headers={"Location": httpserver.url_for("/elsewhere")}))
    httpserver.expect_request("/elsewhere").respond_with_json({"tags": ["mortgage"]})
    response = _generate(client, tenant)
    assert_envelope(response, 502, "context store request failed")
    assert [request.path for request, _ in httpserver.log] == ["/context"]
    assert _failures(caplog)[-1] == f"status {status}"
    assert _no_intent_written(client.application) and _nothing_metered(client, tenant)


def test_read_timeout_is_502(client, tenant, httpserver, store_url, caplog):
    answered = threading.Event()

    def slow(request):
        time.sleep(1.2)
        answered.set()
        return Response(json.dumps({"tags": []}), content_type="application/json")

    httpserver.expect_request("/context").respond_with_handler(slow)
    started = time.monotonic()
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert time.monotonic() - started < 1.1
    assert _no_intent_written(client.application)
    assert [r.failure for r in caplog.records if hasattr(r, "failure")][-1] == "read timeout"
    # The test server answers one request at a time: let it finish before the next test.
    assert answered.wait(timeout=5)


def test_refused_connection_is_502(client, tenant, app, caplog):
    app.config["CONTEXT_STORE_URL"] = f"http://127.0.0.1:{free_port()}/context"
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _no_intent_written(client.application)
    assert [r.failure for r in caplog.records if hasattr(r, "failure")][-1] == "connection failed"


def test_answer_of_64_kib_is_read_and_one_byte_more_is_502(client, tenant, httpserver, store_url,
                                                          caplog):
    answer = json.dumps({"tags": ["checkout"]}).encode()
    padded = answer + b" " * (64 * 1024 - len(answer))
    httpserver.expect_ordered_request("/context").respond_with_data(
        padded, content_type="application/json")
    httpserver.expect_ordered_request("/context").respond_with_data(
        padded + b" ", content_type="application/json")
    assert _generate(client, tenant).get_json()["intent_class"] == "commerce"
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["answer too large"]


@pytest.mark.parametrize("answer, failure", [
    # Deep enough to exhaust the JSON parser's recursion: a RecursionError, not a 500.
    ("[" * 30_000 + "]" * 30_000, "answer is nested too deeply"),
    ('{"tags": [], "extra": ' + "[" * 64 + "]" * 64 + "}", "answer is nested too deeply"),
    ('{"tags": ["checkout"], "extra": ' + "[" * 63 + "]" * 63 + "}", None),
    # Nor is anything a request body may not hold.
    ('{"tags": ["checkout"], "score": NaN}', "answer is not JSON"),
    ('{"tags": ["checkout", "\\ud800"]}', "answer is not JSON"),
    ('{"tags": ["checkout"]}'.encode("utf-16"), "answer is not JSON"),
])
def test_an_answer_no_request_body_could_be_is_502(client, tenant, httpserver, store_url,
                                                  caplog, answer, failure):
    httpserver.expect_request("/context").respond_with_data(answer, content_type="application/json")
    response = _generate(client, tenant)
    if failure is None:
        assert response.get_json()["intent_class"] == "commerce"
        return
    assert_envelope(response, 502, "context store request failed")
    assert _no_intent_written(client.application) and _nothing_metered(client, tenant)
    assert _failures(caplog) == [failure]


class RawStore:
    """A context store on a raw socket: answers one request by calling `answer(store, conn)`.

    It stops by itself: the accept and every send give up after 10 s, and each `answer` is
    bounded in count.
    """

    def __init__(self, answer):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/context"
        self.sent = 0
        self.send_failed = False
        self.thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self.thread.start()

    def _serve(self, answer):
        with self.listener:
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                return
        with connection:
            connection.settimeout(10)
            request = b""
            while not (b"\r\n\r\n" in request and request.endswith(b"{}")):
                request += connection.recv(4096)
            try:
                answer(self, connection)
            except OSError:
                self.send_failed = True

    def send(self, connection, data):
        connection.sendall(data)
        self.sent += len(data)


@pytest.fixture
def raw_store(app):
    app.config["CONTEXT_STORE_DEADLINE"] = 2
    app.config["CONTEXT_STORE_READ_TIMEOUT"] = 5  # longer than any pause below

    def start(answer):
        store = RawStore(answer)
        app.config["CONTEXT_STORE_URL"] = store.url
        return store

    return start


HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def _drip_body(store, connection):
    store.send(connection, HEADERS % 20)
    for _ in range(20):  # 20 s in all, unless the client hangs up first
        store.send(connection, b" ")
        time.sleep(1)


def _drip_headers(store, connection):
    for byte in (HEADERS % 20)[:40]:  # 20 s in all, unless the client hangs up first
        store.send(connection, bytes([byte]))
        time.sleep(0.5)


@pytest.mark.parametrize("drip", [_drip_body, _drip_headers], ids=["body", "headers"])
def test_a_store_dripping_bytes_is_cut_off_at_the_deadline(client, tenant, raw_store, caplog,
                                                           drip):
    store = raw_store(drip)
    started = time.monotonic()
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    # The drip would take 20 s and no single read waits 5 s: only the 2 s deadline ends it.
    assert time.monotonic() - started < 10
    assert _failures(caplog) == ["deadline exceeded"]
    assert _no_intent_written(client.application) and _nothing_metered(client, tenant)
    store.thread.join(timeout=15)
    assert store.send_failed  # the client hung up rather than leaving the store connected


def test_a_huge_answer_is_not_read_past_64_kib(client, tenant, raw_store, caplog):
    size = 300 * 1024 * 1024

    def huge(store, connection):
        store.send(connection, HEADERS % size)
        chunk = b" " * (64 * 1024)
        for _ in range(size // len(chunk)):
            store.send(connection, chunk)

    store = raw_store(huge)
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["answer too large"]
    assert _no_intent_written(client.application) and _nothing_metered(client, tenant)
    store.thread.join(timeout=15)
    # The client hung up after 64 KiB + 1; what the store got out is what socket buffers hold.
    assert store.send_failed and store.sent < 32 * 1024 * 1024


def test_an_answer_arriving_in_pieces_is_read_whole(client, tenant, raw_store):
    answer = json.dumps({"tags": ["checkout"]}).encode()

    def in_pieces(store, connection):
        store.send(connection, HEADERS % len(answer) + answer[:5])
        time.sleep(0.3)
        store.send(connection, answer[5:])

    raw_store(in_pieces)
    assert _generate(client, tenant).get_json()["intent_class"] == "commerce"


@pytest.mark.parametrize("value", ["0", "30", "-1", "soon"])
def test_a_deadline_outside_the_request_budget_stops_start_up(monkeypatch, settings, value):
    monkeypatch.setenv("CONTEXT_STORE_DEADLINE", value)
    with pytest.raises(ConfigError, match="CONTEXT_STORE_DEADLINE"):
        create_app(settings)


class SilentStore:
    """A context store that accepts every connection, reads the request and never answers."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/context"
        self.requests = 0
        self.held = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed
                return
            connection.settimeout(10)
            if connection.recv(4096):
                self.held.append(connection)
                self.requests += 1

    def wait_for(self, count):
        for _ in range(100):  # up to 10 s for the store's thread to see the request
            if self.requests >= count:
                return self.requests
            time.sleep(0.1)
        return self.requests

    def close(self):
        self.listener.close()
        for connection in self.held:
            connection.close()


@pytest.fixture
def silent_store(app):
    store = SilentStore()
    app.config.update(CONTEXT_STORE_URL=store.url, CONTEXT_STORE_DEADLINE=0.5,
                      CONTEXT_STORE_READ_TIMEOUT=0.3)
    yield store
    store.close()


def _breaks(caplog):
    return [r.seconds for r in caplog.records if r.getMessage() == "context store breaker open"]


def test_a_store_that_does_not_answer_holds_a_worker_once_per_break(client, tenant, app,
                                                                    silent_store, httpserver,
                                                                    caplog):
    """With the store hung, every generate would hold its worker for the whole deadline, and
    everything else queues behind it: after a timeout the worker answers 502 at once for the
    break, then one request tries again, and a store that answers closes the breaker."""
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    opened = time.time()  # the break began before this
    assert silent_store.wait_for(1) == 1 and _breaks(caplog) == [5.0]
    for _ in range(3):  # within the break: no call at all
        assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["read timeout"] + ["breaker open"] * 3
    assert silent_store.requests == 1 and _no_intent_written(app)

    with time_machine.travel(opened + 5.5):  # the break is over: one trial, still hung
        assert_envelope(_generate(client, tenant), 502, "context store request failed")
        reopened = time.time()
        assert silent_store.wait_for(2) == 2 and _breaks(caplog) == [5.0, 10.0]
        assert_envelope(_generate(client, tenant), 502, "context store request failed")
        assert _failures(caplog)[-1] == "breaker open"

    app.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    httpserver.expect_request("/context").respond_with_json({"tags": ["weather"]})
    with time_machine.travel(reopened + 10.5):  # the trial finds the store answering
        for _ in range(2):
            assert _generate(client, tenant).status_code == 200
    assert len(httpserver.log) == 2 and silent_store.requests == 2


def test_calls_in_flight_when_the_breaker_opens_do_not_lengthen_the_break():
    """A gthread worker's threads all time out at once on a store that blipped: the break is
    the first one, not doubled once per thread; only a failed trial doubles it."""
    breaker = Breaker(5.0)
    admitted = [breaker.allow() for _ in range(4)]
    assert [breaker.timed_out(call) for call in admitted] == [5.0] * 4
    with time_machine.travel(time.time() + 6):
        trial = breaker.allow()
        assert trial == TRIAL and breaker.allow() is None  # one trial at a time
        assert breaker.timed_out(trial) == 10.0


def test_a_store_silent_after_its_headers_opens_the_breaker(client, tenant, app, raw_store,
                                                            caplog):
    """Headers, the start of the body, then nothing: the read timeout within the body is the
    store falling silent, as before its headers. requests reports it as a ConnectionError,
    which was taken for a quick failure: every generate then held its worker for the whole
    read timeout, and no break began."""
    app.config.update(CONTEXT_STORE_DEADLINE=5, CONTEXT_STORE_READ_TIMEOUT=0.3)

    def silent_after_headers(store, connection):
        store.send(connection, HEADERS % 20 + b'{"tags"')
        time.sleep(1)

    store = raw_store(silent_after_headers)
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["read timeout"] and _breaks(caplog) == [5.0]
    # Within the break, no call at all (the store, which answers one connection, would have
    # refused it: "connection failed").
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["read timeout", "breaker open"]
    assert _no_intent_written(app) and _nothing_metered(client, tenant)
    store.thread.join(timeout=10)


def _late(status):
    """A store that answers `status`, with no body, half a second after the request."""
    def answer(store, connection):
        time.sleep(0.5)
        store.send(connection, b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
    return answer


def test_a_slow_failure_opens_the_breaker_as_a_timeout_does(client, tenant, app, raw_store,
                                                            caplog):
    """A 504 after as long as a connection may take held the worker as a timeout would: taken
    for a quick failure, every generate waited it out and no break began (a probe: 12
    generates of 19 s each, /health answered after 19 s)."""
    app.config["CONTEXT_STORE_CONNECT_TIMEOUT"] = 0.3
    store = raw_store(_late(b"504 Gateway Timeout"))
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["status 504"] and _breaks(caplog) == [5.0]
    # Within the break, no call at all (the store answers one connection only).
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["status 504", "breaker open"]
    store.thread.join(timeout=10)


def test_a_slow_refusal_of_a_token_opens_no_breaker(client, tenant, app, raw_store, caplog):
    """A 401 for one user's token, however slow, is the store working: one client's bad
    tokens must not cut every tenant's generates off."""
    app.config["CONTEXT_STORE_CONNECT_TIMEOUT"] = 0.3
    store = raw_store(_late(b"401 Unauthorized"))
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["status 401"] and _breaks(caplog) == []
    store.thread.join(timeout=10)


def test_a_quick_failure_opens_no_breaker(client, tenant, app, caplog):
    app.config["CONTEXT_STORE_URL"] = f"http://127.0.0.1:{free_port()}/context"
    for _ in range(3):
        assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _failures(caplog) == ["connection failed"] * 3 and _breaks(caplog) == []
