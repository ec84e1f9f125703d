"""The documented setups with a real nginx in front of real gunicorn: deploy/nginx.conf (TLS) and
deploy/nginx-compose.conf (the compose stack). Sync workers never face a slow client; /metrics
stays off the public listener; the app trusts exactly the one hop nginx is."""
import json
import ssl
import time
from pathlib import Path

import pytest
import requests
import trustme

from tests.proxies import NginxServer, SlowClients, nginx_binary, render
from tests.support import raw_http

CONFIGS = ["nginx.conf", "nginx-compose.conf"]


@pytest.fixture
def nginx():
    binary = nginx_binary()
    if not binary:
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx-light)")
    return binary


@pytest.fixture
def tls(tmp_path):
    ca = trustme.CA()
    certificate = ca.issue_cert("127.0.0.1")
    paths = {"cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem", "ca": tmp_path / "ca.pem"}
    certificate.cert_chain_pems[0].write_to_path(paths["cert"])
    certificate.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    return paths


@pytest.fixture
def behind_nginx(embedded_gunicorn, nginx, tls, tmp_path):
    """start(config, **environment): sync gunicorn workers (as in production) behind nginx.
    Returns (gunicorn, nginx, base URL through nginx, verify argument for requests)."""
    start_gunicorn, _ = embedded_gunicorn
    proxies = []

    def start(config, **environment):
        server = start_gunicorn(workers=2, threads=1, TRUSTED_PROXY_HOPS="1", **environment)
        directory = tmp_path / config.replace(".", "-")
        directory.mkdir()
        path, port, plain_port = render(config, directory, server.port, tls)
        proxy = NginxServer(nginx, path, port, directory)
        proxy.plain_port = plain_port
        proxies.append(proxy)
        proxy.start()
        scheme = "https" if config == "nginx.conf" else "http"
        return server, proxy, f"{scheme}://127.0.0.1:{port}", str(tls["ca"])

    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.mark.parametrize("config", CONFIGS)
def test_slow_clients_hold_nginx_connections_never_the_workers(behind_nginx, tls, config):
    server, proxy, url, verify = behind_nginx(config, REQUIRE_TLS="false")
    context = None
    if config == "nginx.conf":
        context = ssl.create_default_context(cafile=verify)
    # 20 slow clients against 2 workers: facing gunicorn directly they would hold both workers
    # for the whole 40 s worker timeout and /health would not answer.
    with SlowClients(proxy.port, count=20, context=context) as slow:
        answered, deadline = 0, time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(1)
            response = requests.get(url + "/health", verify=verify, timeout=15)
            assert response.status_code == 200 and response.json()["status"] == "ok"
            assert slow.held() == 20, "every slow client is still connected and unanswered"
            answered += 1
    assert answered >= 1


def _nginx_envelope(response, status, error):
    """An answer nginx made itself, in the contract's envelope with its request id."""
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.json() == {"error": error, "request_id": response.headers["X-Request-Id"]}
    return True


@pytest.mark.parametrize("config", CONFIGS)
def test_nginx_answers_of_its_own_are_json(behind_nginx, config):
    server, _, url, verify = behind_nginx(config, REQUIRE_TLS="false")
    too_large = requests.post(url + "/v1/intent/generate", data=b"x" * (70 * 1024), verify=verify,
                              headers={"Content-Type": "application/json"}, timeout=10)
    assert _nginx_envelope(too_large, 413, "request body too large (limit 64 KiB)")
    assert "Retry-After" not in too_large.headers
    server.stop()
    unreachable = requests.get(url + "/health", verify=verify, timeout=20)
    assert _nginx_envelope(unreachable, 503, "service temporarily unavailable")
    assert unreachable.headers["Retry-After"] == "1"


@pytest.mark.parametrize("config", CONFIGS)
def test_nginx_keeps_metrics_private_and_is_the_one_trusted_hop(behind_nginx, config):
    server, _, url, verify = behind_nginx(
        config, METRICS_ENABLED="true", AUTH_FAILURE_LIMIT="5 per minute",
        REQUIRE_TLS="true" if config == "nginx.conf" else "false")
    for path in ("/metrics", "/metrics?format=text", "//metrics", "/%6Detrics"):
        denied = requests.get(url + path, verify=verify, timeout=10)
        # nginx's own refusal, in the envelope: the request never reached gunicorn.
        assert _nginx_envelope(denied, 403, "forbidden"), path
    assert not [record for record in server.log_records()
                if record.get("logger") == "app.access" and "etrics" in record.get("path", "")]
    # HTTPS as nginx saw it counts (REQUIRE_TLS with nginx.conf): past the HTTPS check, only the
    # key is wrong. nginx overwrites a client's X-Forwarded-For, so a new address per attempt
    # does not escape the failed-authentication limit, one bucket for both workers.
    started = time.monotonic()
    answers = [requests.get(url + "/v1/tenant/usage", verify=verify, timeout=10,
                            headers={"X-Service-Key": "key_live_" + "0" * 48,
                                     "X-Forwarded-For": f"203.0.113.{attempt}"})
               for attempt in range(12)]
    statuses = [answer.status_code for answer in answers]
    refilled = int((time.monotonic() - started) * 5 / 60) + 1  # 5 a minute, however slow
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) <= {401, 429}, statuses
    assert statuses.count(401) <= 5 + refilled, statuses
    # nginx passes the app's own Server header: no server software named.
    assert {answer.headers["Server"] for answer in answers} == {"intentgate"}


@pytest.mark.parametrize("config", CONFIGS)
def test_requests_nginx_refuses_itself_are_answered_in_the_envelope(behind_nginx, config):
    """What nginx refuses before gunicorn sees it (a request line or headers too long, a request
    it cannot parse, plain HTTP on the TLS port) is JSON too, never nginx's HTML page."""
    server, proxy, _, verify = behind_nginx(config, REQUIRE_TLS="false")
    context = ssl.create_default_context(cafile=verify) if config == "nginx.conf" else None
    refused = {
        b"GET /v1/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n":
            (414, "request line too long"),
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n":
            (431, "request headers too large"),
        b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n": (400, "malformed HTTP request"),
        b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n": (400, "malformed HTTP request"),
        b"GET /.intentgate-error HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n":
            (404, "not found"),
        b"TRACE /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n":
            (405, "method not allowed"),
        b"POST /v1/intent/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Transfer-Encoding: gzip\r\n\r\n": (501, "transfer coding not supported"),
    }
    for request, (status, error) in refused.items():
        answer = raw_http(proxy.port, request, context)
        assert answer[0] == status, (request[:40], answer)
        assert answer[1]["content-type"] == ["application/json"], request[:40]
        assert json.loads(answer[2]) == {"error": error,
                                         "request_id": answer[1]["x-request-id"][0]}
    if config == "nginx.conf":
        plain = raw_http(proxy.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert plain[0] == 403 and json.loads(plain[2])["error"] == (
            "HTTPS is required: this service does not accept plain HTTP")
    assert not [record for record in server.log_records()
                if record.get("logger") == "app.access" and record.get("status") != 200]


def test_plain_http_is_refused_in_the_envelope_except_health_and_hsts_is_sent_once(behind_nginx):
    """nginx.conf's plain HTTP listener answers as the app does in production (deploy/README.md):
    403 in the envelope, /health excepted; never a redirect, nor nginx's HTML."""
    server, proxy, url, verify = behind_nginx("nginx.conf", REQUIRE_TLS="true")
    plain = f"http://127.0.0.1:{proxy.plain_port}"
    for method, path in (("GET", "/v1/tenant/usage"), ("POST", "/v1/intent/generate"),
                         ("GET", "/metrics"), ("GET", "/")):
        refused = requests.request(method, plain + path, allow_redirects=False, timeout=10,
                                   headers={"X-Service-Key": "key_live_" + "0" * 48})
        assert _nginx_envelope(refused, 403,
                               "HTTPS is required: this service does not accept plain HTTP"), path
    health = requests.get(plain + "/health", allow_redirects=False, timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # Every answer carries HSTS exactly once (the app's and nginx's would be two).
    answers = [requests.get(base + path, verify=verify, timeout=10)
               for base in (url, plain) for path in ("/health", "/v1/tenant/usage", "/metrics")]
    for answer in answers:
        assert answer.raw.headers.getlist("Strict-Transport-Security") == [
            "max-age=63072000; includeSubDomains"], answer.url


@pytest.mark.parametrize("config", CONFIGS)
def test_nginx_answers_echo_the_callers_request_id_as_the_app_does(behind_nginx, config):
    """CONTRACT.md: a caller's X-Request-Id matching the pattern is echoed on every answer, errors
    included; one holding a credential is replaced, as app.http replaces it."""
    _, _, url, verify = behind_nginx(config, REQUIRE_TLS="false")
    for supplied, echoed in (("trace-42.a_B", True), ("x" * 128, True), ("x" * 129, False),
                             ("has space", False), ("key_live_" + "0" * 48, False),
                             ("whsec_abc", False), (None, False)):
        headers = {} if supplied is None else {"X-Request-Id": supplied}
        for path in ("/metrics", "/.intentgate-error"):
            answer = requests.get(url + path, headers=headers, verify=verify, timeout=10)
            request_id = answer.headers["X-Request-Id"]
            assert answer.json()["request_id"] == request_id, (supplied, path)
            assert (request_id == supplied) is echoed, (supplied, path)
            if not echoed:
                assert len(request_id) == 32 and int(request_id, 16) >= 0


@pytest.mark.parametrize("config", CONFIGS)
def test_nginx_logs_no_credential_a_client_puts_in_its_url(behind_nginx, config):
    """The app and gunicorn mask a key in a URL; nginx's access log must not write it either,
    and a body the service takes (up to 64 KiB) is kept in memory, not a file and a warning."""
    server, proxy, url, verify = behind_nginx(config, REQUIRE_TLS="false")
    secret = "key_live_" + "0123456789abcdef" * 3
    for method, path in (("GET", f"/v1/tenant/usage?key={secret}"),
                         ("DELETE", f"/v1/tenant/keys/{secret}")):
        assert requests.request(method, url + path, verify=verify, timeout=10).status_code == 401
    answer = requests.post(url + "/v1/intent/verify", data=b"{" + b" " * 60_000 + b"}",
                           headers={"Content-Type": "application/json"}, verify=verify,
                           timeout=10)
    assert answer.status_code == 401
    proxy.stop()  # its logs written out
    directory = Path(proxy.log_path).parent
    logs = "".join(path.read_text() for path in directory.iterdir()
                   if path.suffix in (".log", ".out"))
    assert "0123456789abcdef" not in logs
    assert '"GET" 401' in logs and '"DELETE" 401' in logs and '"POST" 401' in logs
    assert "buffered to a temporary file" not in logs
