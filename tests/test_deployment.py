"""gunicorn as deployed: TLS 1.3 only (real handshakes), graceful shutdown on SIGTERM."""
import json
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import trustme
from werkzeug import Response

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
    for unit, sections in [("intentgate.service", {"Unit", "Service", "Install"}),
                           ("intentgate-purge.service", {"Unit", "Service"}),
                           ("intentgate-purge.timer", {"Unit", "Timer", "Install"})]:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str
        parser.read_string((ROOT / "deploy" / unit).read_text())
        assert sections <= set(parser.sections()), unit
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "\nUSER intentgate\n" in dockerfile and "db upgrade" not in dockerfile.split("CMD")[-1]


def test_metrics_aggregate_every_gunicorn_worker(embedded_gunicorn, tmp_path):
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "metrics@example.com", "--json"))
    server = start(workers=3, threads=1, METRICS_ENABLED="true",
                   PROMETHEUS_MULTIPROC_DIR=tmp_path / "prometheus")
    request_ids = []
    for index in range(30):
        request_id = f"metrics-{index}"
        request_ids.append(request_id)
        response = requests.post(server.url + "/v1/intent/verify", timeout=10,
                                 headers={"X-Service-Key": created["api_key"],
                                          "X-Request-Id": request_id},
                                 json={"original_intent_hash": "sha256:" + "e" * 64,
                                       "response": {"match_id": f"m{index}", "payload": {},
                                                    "timestamp": 1, "signature": "00"}})
        assert response.json()["reason"] == "UnknownIntent"
    assert len(server.pids_for(request_ids)) >= 2
    text = requests.get(server.url + "/metrics", timeout=10).text
    line = next(line for line in text.splitlines()
                if line.startswith('intentgate_verifications_total{outcome="UnknownIntent"}'))
    assert float(line.rsplit(" ", 1)[1]) == 30
