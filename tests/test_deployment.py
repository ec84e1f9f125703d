"""gunicorn as deployed: TLS 1.3 only (real handshakes), graceful shutdown on SIGTERM."""
import base64
import json
import os
import runpy
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
import trustme
from werkzeug import Response

from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def certificates(tmp_path):
    ca = trustme.CA()
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca")}
    certificate.cert_chain_pems[0].write_to_path(paths["cert"])
    certificate.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    return ca, paths


def _handshake(port, ca, maximum=None):
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if maximum is not None:
        context.maximum_version = maximum
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.version()


def test_gunicorn_serves_tls_1_3_only(embedded_gunicorn, certificates):
    start, _ = embedded_gunicorn
    ca, paths = certificates
    server = start(workers=1, threads=2, ca_file=str(paths["ca"]),
                   TLS_CERTFILE=paths["cert"], TLS_KEYFILE=paths["key"])
    assert _handshake(server.port, ca) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        _handshake(server.port, ca, maximum=ssl.TLSVersion.TLSv1_2)
    health = requests.get(server.url + "/health", verify=str(paths["ca"]), timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # The container's health check speaks TLS to it too.
    assert _healthcheck(GUNICORN_BIND=f"0.0.0.0:{server.port}",
                        TLS_CERTFILE=paths["cert"]).returncode == 0


def _served_certificate(port, ca):
    """The certificate (DER) a handshake with the server on `port` is answered with."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def _reload(server):
    """SIGHUP, then wait until the master has booted a worker more (30 s at most)."""
    booted = server.log_path.read_text().count("Booting worker")
    server.process.send_signal(signal.SIGHUP)
    for _ in range(300):
        if server.log_path.read_text().count("Booting worker") > booted:
            break
        assert server.process.poll() is None, server.log_path.read_text()[-2000:]
        time.sleep(0.1)
    assert server.process.poll() is None, server.log_path.read_text()[-2000:]


def _reload_errors(server):
    return [record["message"] for record in server.log_records()
            if record.get("level") == "ERROR" and record["message"].startswith("reload: ")]


def test_a_reload_serves_a_renewed_tls_pair_and_keeps_the_one_in_use_when_it_is_broken(
        embedded_gunicorn, certificates):
    """The pair is read by the master, at its start and at each reload (gunicorn would read it
    at every connection): one half rewritten breaks no handshake, and a reload that cannot read
    it is logged and goes on with the pair in use, where gunicorn would exit."""
    start, _ = embedded_gunicorn
    ca, paths = certificates
    server = start(workers=1, threads=1, ca_file=str(paths["ca"]),
                   TLS_CERTFILE=paths["cert"], TLS_KEYFILE=paths["key"])
    first = _served_certificate(server.port, ca)
    renewed = ca.issue_cert("127.0.0.1", "localhost")
    renewed.cert_chain_pems[0].write_to_path(paths["cert"])  # its key not written yet
    assert _served_certificate(server.port, ca) == first
    _reload(server)
    assert _served_certificate(server.port, ca) == first
    said = _reload_errors(server)
    assert len(said) == 1 and said[0].startswith(
        "reload: TLS_CERTFILE and TLS_KEYFILE must name a readable PEM certificate and its "
        "private key (SSLError: [X509: KEY_VALUES_MISMATCH]")
    assert said[0].endswith("; the TLS pair read before is kept")
    renewed.private_key_pem.write_to_path(paths["key"])
    _reload(server)
    expected = ssl.PEM_cert_to_DER_cert(renewed.cert_chain_pems[0].bytes().decode())
    for _ in range(100):  # the worker from before the reload may take a connection as it exits
        if _served_certificate(server.port, ca) == expected:
            break
        time.sleep(0.1)
    assert _served_certificate(server.port, ca) == expected
    assert requests.get(server.url + "/health", verify=str(paths["ca"]), timeout=5).ok


def test_a_broken_taxonomy_neither_fails_a_recycled_worker_nor_stops_a_reload(
        embedded_gunicorn, httpserver, tmp_path):
    """The taxonomy is read by the master and inherited by its workers: one recycled after
    max_requests does not read the file again (a broken one failed its boot, and gunicorn
    stops when a worker fails to boot), and a reload that cannot read it keeps the one read."""
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "taxonomy@example.com", "--json"))
    path = tmp_path / "taxonomy.json"
    path.write_text(json.dumps({"classes": [{"name": "finance", "keywords": ["yoga"]}]}))
    httpserver.expect_request("/ctx").respond_with_json({"tags": ["yoga"]})
    server = start(workers=1, threads=1, TAXONOMY_PATH=path,
                   CONTEXT_STORE_URL=httpserver.url_for("/ctx"),
                   GUNICORN_MAX_REQUESTS=2, GUNICORN_MAX_REQUESTS_JITTER=0)

    def intent_class():
        answer = requests.post(server.url + "/v1/intent/generate",
                               headers={"X-Service-Key": created["api_key"]},
                               json={"user_token": "taxonomy-user-token"}, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["intent_class"]

    assert intent_class() == "finance"  # the file's taxonomy, not the shipped one (wellness)
    path.write_text('{"classes": [')
    for _ in range(4):  # the worker is replaced after every second request
        assert intent_class() == "finance"
    _reload(server)
    assert intent_class() == "finance"
    assert len(_reload_errors(server)) == 1
    assert _reload_errors(server)[0].startswith("reload: TAXONOMY_PATH cannot be read as JSON")
    assert server.process.poll() is None


def test_sigterm_finishes_in_flight_requests_refuses_new_ones_and_exits_0(embedded_gunicorn,
                                                                           httpserver):
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "slow@example.com", "--json"))
    arrived = threading.Event()

    def slow_context_store(request):
        arrived.set()
        time.sleep(2)
        return Response(json.dumps({"tags": ["yoga"]}), content_type="application/json")

    httpserver.expect_request("/ctx").respond_with_handler(slow_context_store)
    server = start(workers=2, threads=1, CONTEXT_STORE_URL=httpserver.url_for("/ctx"))
    outcome = {}

    def slow_generate():
        outcome["response"] = requests.post(
            server.url + "/v1/intent/generate", headers={"X-Service-Key": created["api_key"]},
            json={"user_token": "slow-user-token"}, timeout=30)

    caller = threading.Thread(target=slow_generate)
    caller.start()
    assert arrived.wait(10), "the request should have reached the context store"
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/health", timeout=2)
    caller.join(30)
    assert outcome["response"].status_code == 200
    assert outcome["response"].json()["intent_class"] == "wellness"
    assert server.process.wait(30) == 0


PLAIN_HTTP_REFUSED = "HTTPS is required: this service does not accept plain HTTP"


def test_only_trusted_proxy_hops_decides_what_a_forwarded_header_may_claim(embedded_gunicorn):
    """gunicorn trusts forwarded headers from 127.0.0.1 by default; the app alone must decide."""
    start, _ = embedded_gunicorn
    direct = start(workers=1, threads=1, REQUIRE_TLS="true")
    for header, value in [("X-Forwarded-Proto", "https"), ("X-Forwarded-Ssl", "on"),
                          ("X-Forwarded-Protocol", "ssl")]:
        response = requests.get(direct.url + "/v1/tenant/usage", headers={header: value},
                                timeout=10)
        assert response.status_code == 403, (header, response.text)
        assert response.json()["error"] == PLAIN_HTTP_REFUSED
    # gunicorn would also let the same peer move the app under another SCRIPT_NAME.
    health = requests.get(direct.url + "/health", headers={"SCRIPT_NAME": "/elsewhere"},
                          timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    proxied = start(workers=1, threads=1, REQUIRE_TLS="true", TRUSTED_PROXY_HOPS="1")
    response = requests.get(proxied.url + "/v1/tenant/usage",
                            headers={"X-Forwarded-Proto": "https"}, timeout=10)
    assert response.status_code == 401  # past the HTTPS check: only the key is missing


@pytest.fixture
def nginx():
    binary = shutil.which("nginx") or (Path("/usr/sbin/nginx").exists() and "/usr/sbin/nginx")
    if not binary:
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx-light to check "
                    "deploy/nginx.conf)")
    return binary


def test_nginx_config_is_valid(nginx, certificates, tmp_path):
    _, paths = certificates
    config = (ROOT / "deploy" / "nginx.conf").read_text()
    config = (config.replace("/etc/ssl/intentgate/fullchain.pem", str(paths["cert"]))
                    .replace("/etc/ssl/intentgate/privkey.pem", str(paths["key"]))
                    .replace("/run/nginx-intentgate.pid", str(tmp_path / "nginx.pid"))
                    .replace("/var/log/nginx/", str(tmp_path) + "/"))
    assert "ssl_protocols TLSv1.3;" in config and "Strict-Transport-Security" in config
    (tmp_path / "nginx.conf").write_text(config)
    result = subprocess.run([nginx, "-t", "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path),
                             "-e", str(tmp_path / "error.log")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr and "test is successful" in result.stderr


def test_compose_and_systemd_files_are_well_formed():
    import configparser

    import yaml

    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    assert {"postgres", "redis", "migrate", "app"} <= set(compose["services"])
    assert compose["services"]["migrate"]["command"] == ["flask", "db", "upgrade"]
    assert compose["services"]["app"]["depends_on"]["migrate"]["condition"] == \
        "service_completed_successfully"
    assert compose["services"]["webhooks"]["command"] == ["flask", "webhooks", "deliver"]
    assert compose["services"]["webhooks"]["image"] == compose["services"]["app"]["image"]
    # The long-running services come back after an exit, as the systemd units do.
    assert {name for name, service in compose["services"].items()
            if service.get("restart") == "unless-stopped"} == {"app", "webhooks"}
    for unit, sections in [("intentgate.service", {"Unit", "Service", "Install"}),
                           ("intentgate-purge.service", {"Unit", "Service"}),
                           ("intentgate-webhooks.service", {"Unit", "Service", "Install"}),
                           ("intentgate-purge.timer", {"Unit", "Timer", "Install"})]:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str
        parser.read_string((ROOT / "deploy" / unit).read_text())
        assert sections <= set(parser.sections()), unit
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "\nUSER 10001:10001\n" in dockerfile and "db upgrade" not in dockerfile.split("CMD")[-1]
    # The build context is the repository: the local key, database and logs (instance/) and a
    # virtualenv never go to the builder.
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"instance", ".venv", ".git"} <= set(ignored)


def test_compose_builds_one_image_and_publishes_only_nginx():
    import yaml

    services = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())["services"]
    assert [name for name, service in services.items() if "build" in service] == ["app"]
    app, migrate = services["app"], services["migrate"]
    # One image: migrate reuses it, and Compose never looks for that name in a registry.
    assert migrate["image"] == app["image"] and migrate.get("build") is None
    assert app["pull_policy"] == "build" and migrate["pull_policy"] == "never"
    # Sync workers never face clients: only nginx publishes a port, on loopback.
    assert {name for name, service in services.items() if service.get("ports")} == {"nginx"}
    assert all(port.startswith("127.0.0.1:") for port in services["nginx"]["ports"])
    source, target, _ = services["nginx"]["volumes"][0].split(":")
    assert (ROOT / "deploy" / source).resolve() == ROOT / "deploy" / "nginx-compose.conf"
    assert target == "/etc/nginx/nginx.conf"
    assert services["nginx"]["depends_on"]["app"]["condition"] == "service_healthy"
    assert app["environment"]["TRUSTED_PROXY_HOPS"] == "1"
    port = app["environment"]["GUNICORN_BIND"].rsplit(":", 1)[1]
    assert f"server app:{port};" in (ROOT / "deploy" / "nginx-compose.conf").read_text()


def _dockerfile_instructions():
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    return [" ".join(line.split()) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_installs_the_runtime_and_checks_health():
    instructions = _dockerfile_instructions()
    assert "RUN pip install -r requirements.txt" in instructions
    healthchecks = [line for line in instructions if line.startswith("HEALTHCHECK ")]
    assert len(healthchecks) == 1
    assert healthchecks[0].endswith('CMD ["python", "deploy/healthcheck.py"]')
    copied = " ".join(line for line in instructions if line.startswith("COPY "))
    assert "deploy/healthcheck.py" in copied and "deploy/gunicorn.conf.py" in copied
    # The worker count comes from gunicorn.conf.py (the container's CPU quota), never pinned here.
    assert not any("GUNICORN_WORKERS" in line for line in instructions)


def _healthcheck(**environment):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GUNICORN_", "TLS_"))}
    env.update({key: str(value) for key, value in environment.items()})
    return subprocess.run([sys.executable, str(ROOT / "deploy" / "healthcheck.py")], env=env,
                          capture_output=True, text=True, timeout=30)


def test_container_healthcheck_asks_gunicorn_for_health(embedded_gunicorn):
    start, _ = embedded_gunicorn
    server = start(workers=1, threads=1)
    assert _healthcheck(GUNICORN_BIND=f"0.0.0.0:{server.port}").returncode == 0
    nothing = _healthcheck(GUNICORN_BIND=f"127.0.0.1:{free_port()}")
    assert nothing.returncode == 1 and len(nothing.stderr.strip().splitlines()) == 1


def test_metrics_aggregate_every_gunicorn_worker(embedded_gunicorn, tmp_path, httpserver):
    def slow_store(request):
        time.sleep(1.5)
        return Response(json.dumps({"tags": ["cart"]}), content_type="application/json")

    # A sync worker waiting on the context store accepts nothing else, so three generates in
    # flight at once are served by three different workers, whatever the kernel prefers.
    httpserver.expect_request("/context", method="POST").respond_with_handler(slow_store)
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "metrics@example.com", "--json"))
    server = start(workers=3, threads=1, METRICS_ENABLED="true",
                   PROMETHEUS_MULTIPROC_DIR=tmp_path / "prometheus",
                   CONTEXT_STORE_URL=httpserver.url_for("/context"))
    request_ids = [f"metrics-{index}" for index in range(3)]

    def generate(request_id):
        return requests.post(server.url + "/v1/intent/generate", timeout=30,
                             headers={"X-Service-Key": created["api_key"],
                                      "X-Request-Id": request_id},
                             json={"user_token": "metrics-user-token"}).status_code

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(generate, request_ids)) == [200] * 3
    assert len(server.pids_for(request_ids)) == 3
    for index in range(30):
        response = requests.post(server.url + "/v1/intent/verify", timeout=10,
                                 headers={"X-Service-Key": created["api_key"]},
                                 json={"original_intent_hash": "sha256:" + "e" * 64,
                                       "response": {"match_id": f"m{index}", "payload": {},
                                                    "timestamp": 1, "signature": "00"}})
        assert response.json()["reason"] == "UnknownIntent"
    text = requests.get(server.url + "/metrics", timeout=10).text
    line = next(line for line in text.splitlines()
                if line.startswith('intentgate_verifications_total{outcome="UnknownIntent"}'))
    assert float(line.rsplit(" ", 1)[1]) == 30
    generated = next(line for line in text.splitlines() if line.startswith(
        'intentgate_http_requests_total{endpoint="/v1/intent/generate",method="POST",status="200"}'))
    assert float(generated.rsplit(" ", 1)[1]) == 3


def test_responses_name_no_server_software_and_carry_protective_headers(embedded_gunicorn):
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "headers@example.com", "--json"))
    server = start(workers=1, threads=1)
    for path, headers in [("/health", {}), ("/nowhere", {}),
                          ("/v1/tenant/usage", {"X-Service-Key": created["api_key"]})]:
        response = requests.get(server.url + path, headers=headers, timeout=10)
        assert response.headers["Server"] == "intentgate", response.headers
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Cache-Control"] == "no-store"


def test_gunicorns_access_line_masks_credentials_and_stays_one_json_line(embedded_gunicorn,
                                                                         leak_watch):
    """GUNICORN_ACCESSLOG=-: gunicorn's line masks what the app's masks, in the path and the
    query alike, and a decoded %0a or %00 in the path is escaped, not written raw."""
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "access@example.com", "--json"))
    # A webhook secret's base64 may hold "+" and "/": this one starts with both.
    webhook_secret = "whsec_" + base64.b64encode(b"\xfb\xff\xbf" + os.urandom(21)).decode()
    credentials = [created["api_key"], created["signing_secret"], webhook_secret]
    leak_watch.add(*credentials)
    server = start(workers=1, threads=1, GUNICORN_ACCESSLOG="-")
    query = "&".join(f"c{n}={value}" for n, value in enumerate(credentials))
    paths = [f"/v1/tenant/keys/{quote(value, safe='')}?{query}" for value in credentials]
    # A line break, a quote after a backslash and a NUL, each decoded into the path by gunicorn.
    paths.append(f"/v1/tenant/keys/k%0A%7B%22injected%22%3A%201%7D%5C%22%00nul-tail?{query}")
    request_ids = [f"access-{n}" for n in range(len(paths))]
    for path, request_id in zip(paths, request_ids):
        response = requests.delete(server.url + path, timeout=10, headers={
            "X-Service-Key": created["api_key"], "X-Request-Id": request_id})
        assert response.status_code == 404
    server.stop()  # every line written and flushed: gunicorn logs after it has answered
    text = server.log_path.read_text(errors="replace")
    for credential in credentials:
        # The whole value, or what follows a "/" of a webhook secret's base64, anywhere.
        assert credential not in text and credential[-16:] not in text
    assert "\x00" not in text
    # Each line that is, or might be a piece of, an access line is one JSON object.
    records = [json.loads(line) for line in text.splitlines()
               if any(mark in line for mark in ("gunicorn.access", "injected", "nul-tail"))]
    gunicorns = [record for record in records if record["logger"] == "gunicorn.access"]
    assert all(record["request_id"] not in ("", "-") for record in gunicorns)
    ours = [record for record in gunicorns if record["request_id"] in request_ids]
    assert [record["request_id"] for record in ours] == request_ids
    assert [record["path"] for record in ours] == [
        "/v1/tenant/keys/key_live_[redacted]", "/v1/tenant/keys/sig_live_[redacted]",
        "/v1/tenant/keys/whsec_[redacted]",
        '/v1/tenant/keys/k\n{"injected": 1}\\"\x00nul-tail']


def test_the_healthcheck_asks_where_gunicorn_binds(monkeypatch):
    """An empty GUNICORN_BIND is the loopback default to gunicorn.conf.py, so to the probe too
    (it asked http://:/health)."""
    healthcheck = runpy.run_path(str(ROOT / "deploy" / "healthcheck.py"))
    monkeypatch.delenv("TLS_CERTFILE", raising=False)
    for bind, url in (("", "http://127.0.0.1:8000/health"),
                      (" 0.0.0.0:9000 , [::1]:9001", "http://127.0.0.1:9000/health"),
                      ("[::]:9002", "http://[::1]:9002/health")):
        monkeypatch.setenv("GUNICORN_BIND", bind)
        assert healthcheck["health_url"]() == url
