"""PostgreSQL restarted under a running service: clear 503s, recovery without a restart, and
no intent used twice."""
import os
import shutil
import subprocess
import time

import pytest
import requests

from app.extensions import db
from tests.conftest import TEST_DATABASE_URL, TEST_HOSTS, TEST_PGBOUNCER
from tests.support import scale_response

ROOMY = {"AUTH_FAILURE_LIMIT": "1000 per minute", "RATE_LIMIT_CAPACITY": 1000}


@pytest.fixture
def restartable_postgres():
    local = TEST_DATABASE_URL and "127.0.0.1" in TEST_DATABASE_URL
    if not local or shutil.which("pg_ctlcluster") is None or os.geteuid() != 0:
        pytest.skip("restarting PostgreSQL needs the local cluster, pg_ctlcluster and root")
    version = sorted(os.listdir("/etc/postgresql"))[-1]

    def ready():
        return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1"]).returncode == 0

    def control(action):
        if action == "start" and ready():
            return
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action]
                       + (["-m", "fast"] if action == "stop" else []), check=True, timeout=60)
        if action == "start":
            for _ in range(60):
                if ready():
                    return
                time.sleep(0.5)

    yield control
    control("start")  # whatever happened, leave PostgreSQL running for the rest of the suite


def test_postgres_restart_mid_run(app, gunicorn, tenant, restartable_postgres):
    server = gunicorn(workers=2, **ROOMY)
    headers = tenant.headers

    def generate():
        return requests.post(server.url + "/v1/intent/generate", headers=headers, timeout=15,
                             json={"user_token": "restart-user-token"})

    def verify(intent_hash, response):
        return requests.post(server.url + "/v1/intent/verify", headers=headers, timeout=15,
                             json={"original_intent_hash": intent_hash, "response": response})

    first, second = generate().json()["intent_hash"], generate().json()["intent_hash"]
    first_response = scale_response(tenant.signing_secret, first)
    second_response = scale_response(tenant.signing_secret, second)
    assert verify(first, first_response).json()["cleared"] is True

    restartable_postgres("stop")
    try:
        for attempt in (generate(), verify(second, second_response)):
            assert attempt.status_code == 503
            assert attempt.json()["error"] == "service temporarily unavailable"
            assert attempt.headers["Retry-After"] == "1"
    finally:
        restartable_postgres("start")
        with app.app_context():
            db.engine.dispose()  # the test's own pooled connections died with the restart

    # No restart of the service. Which worker takes which request is the kernel's choice, so
    # every request below is retried on a 503 after its Retry-After, as a client would, and the
    # 503s are counted over all of them.
    unavailable = []

    def answered(call, *args):
        for _ in range(5):
            response = call(*args)
            if response.status_code != 503:
                return response
            unavailable.append(response.json()["error"])
            time.sleep(int(response.headers["Retry-After"]))
        raise AssertionError(f"still unavailable after the restart: {unavailable}")

    def usage():
        return requests.get(server.url + "/v1/tenant/usage", headers=headers, timeout=15)

    assert all(answered(usage).status_code == 200 for _ in range(6))
    recovered = answered(verify, second, second_response)
    assert recovered.json() == {"cleared": True, "reason": None, "payload": {"answer": "42"}}
    assert answered(verify, second, second_response).json()["reason"] == "ReplayedIntent"
    assert answered(verify, first, first_response).json()["reason"] == "ReplayedIntent"
    assert answered(generate).status_code == 200
    if not TEST_PGBOUNCER:
        # Straight to PostgreSQL, each worker fails at most once, on its dead pooled connection
        # (the pool is then dropped), whatever the order: two workers a host. Through PgBouncer
        # the workers' connections survive and PgBouncer itself refuses until its next server
        # login (server_login_retry, 1 s): bounded by time, which answered() bounds above.
        assert len(unavailable) <= 2 * TEST_HOSTS, unavailable
