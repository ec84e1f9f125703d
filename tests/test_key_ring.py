"""SECRET_ENCRYPTION_KEY as a key ring (CONTRACT.md, Operating safely): the first key seals,
every key unseals, the database records which keys sealed its secrets, `flask secrets reseal`
moves them all to the first key, and a process whose ring cannot unseal them does not start."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from cryptography.fernet import Fernet, InvalidToken
from flask_migrate import upgrade
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app import create_app, crypto
from app.config import KeyRingMismatch, normalize_database_url
from app.extensions import db
from app.keyring import ring
from app.sql import unit_of_work
from app.tenants import service as tenant_service
from app.webhooks import service as webhook_service
from tests.conftest import TEST_DATABASE_URL
from tests.servers import ROOT, FreezableProxy, GunicornServer, free_port
from tests.support import Credentials, assert_envelope, scale_response

KEY_A, KEY_B, KEY_C = (Fernet.generate_key().decode() for _ in range(3))
MISMATCH = "SECRET_ENCRYPTION_KEY cannot unseal the secrets in this database"
BEFORE_KEY_CHECKS = "a7c1e3f5b209"


@pytest.fixture
def ring_app(base_settings, empty_database_url, leak_watch):
    """ring_app(ring_text): the app on a database of its own, migrated with KEY_A."""
    apps = []

    def make(ring_text):
        app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url,
                          "SECRET_ENCRYPTION_KEY": ring_text, "REDIS_URL": None})
        apps.append(app)
        leak_watch.watch(app)
        return app

    with make(KEY_A).app_context():
        upgrade()
    yield make
    leak_watch.close()
    leaked = leak_watch.leaks_in(leak_watch.buffer.getvalue())
    for app in apps:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()
        app.extensions["database"].engine.dispose()
    assert leaked == [], f"secrets found in the logs: {leaked}"


def _provision(app, leak_watch, email, grace_seconds=0):
    with app.app_context(), unit_of_work():
        provisioned = tenant_service.create_tenant(email, "pro")
    secret = provisioned.signing_secret
    if grace_seconds:
        with app.app_context(), unit_of_work():
            secret, _ = tenant_service.rotate_signing_secret(email, grace_seconds)
    leak_watch.add(provisioned.api_key, provisioned.signing_secret, secret)
    return Credentials(provisioned.tenant.id, email, provisioned.api_key, secret)


def _admin_key(app, leak_watch, name):
    result = app.test_cli_runner().invoke(args=["admin-keys", "create", "--name", name, "--json"])
    assert result.exit_code == 0, result.output
    created = json.loads(result.stdout)
    leak_watch.add(created["api_key"], created["signing_secret"])
    return created


def _verify(app, tenant):
    client = app.test_client()
    intent_hash = client.post("/v1/intent/generate", headers=tenant.headers,
                              json={"user_token": "ring-user-token"}).get_json()["intent_hash"]
    return client.post("/v1/intent/verify", headers=tenant.headers, json={
        "original_intent_hash": intent_hash,
        "response": scale_response(tenant.signing_secret, intent_hash)})


def _sealed(app):
    """Every stored sealed secret."""
    with app.app_context():
        rows = db.session.execute(text(
            "SELECT signing_secret_sealed FROM tenants UNION ALL"
            " SELECT previous_signing_secret_sealed FROM tenants"
            " WHERE previous_signing_secret_sealed IS NOT NULL UNION ALL"
            " SELECT signing_secret_sealed FROM admin_keys UNION ALL"
            " SELECT secret_sealed FROM webhook_endpoints")).scalars().all()
        db.session.remove()
    return rows


def _sealed_with(key, token):
    try:
        Fernet(key).decrypt(token.encode())
        return True
    except InvalidToken:
        return False


def _check_values(app):
    with app.app_context():
        values = set(db.session.execute(text("SELECT check_value FROM secret_key_checks"))
                     .scalars())
        db.session.remove()
    return values


def test_a_fresh_database_records_the_first_key_at_its_first_seal(ring_app, leak_watch):
    app = ring_app(KEY_A)
    assert _check_values(app) == set()  # starting wrote nothing: no secret, no key to record
    _provision(app, leak_watch, "first@example.com")
    assert _check_values(app) == {ring.check_value(KEY_A)}
    stored = " ".join(_check_values(app))
    assert KEY_A not in stored and KEY_A.rstrip("=") not in stored  # a check value, not the key


def test_a_ring_lacking_the_key_that_sealed_the_secrets_does_not_start(ring_app, leak_watch):
    _provision(ring_app(KEY_A), leak_watch, "sealed@example.com")
    for wrong in (KEY_B, f"{KEY_B},{KEY_C}"):
        with pytest.raises(KeyRingMismatch, match=MISMATCH):
            ring_app(wrong)


def test_a_two_key_ring_starts_unseals_the_old_key_and_seals_with_the_new(ring_app, leak_watch):
    old = _provision(ring_app(KEY_A), leak_watch, "old@example.com")
    app = ring_app(f"{KEY_B},{KEY_A}")
    assert _verify(app, old).get_json()["cleared"] is True
    new = _provision(app, leak_watch, "new@example.com")
    assert _verify(app, new).get_json()["cleared"] is True
    old_sealed, new_sealed = _sealed(app)
    assert _sealed_with(KEY_A, old_sealed) and _sealed_with(KEY_B, new_sealed)
    assert not _sealed_with(KEY_A, new_sealed)
    # Both keys sealed secrets here, so a ring without either is refused.
    assert _check_values(app) == {ring.check_value(KEY_A), ring.check_value(KEY_B)}
    for partial in (KEY_A, KEY_B):
        with pytest.raises(KeyRingMismatch, match=MISMATCH):
            ring_app(partial)


def test_reseal_moves_every_secret_and_an_interrupted_run_resumes(ring_app, leak_watch):
    app_a = ring_app(KEY_A)
    tenants = [_provision(app_a, leak_watch, f"t{index}@example.com") for index in range(4)]
    tenants.append(_provision(app_a, leak_watch, "graced@example.com", grace_seconds=3600))
    admin = _admin_key(app_a, leak_watch, "internal")
    with app_a.app_context(), unit_of_work():  # a webhook endpoint's secret is sealed too
        _, webhook_secret = webhook_service.create_endpoint(
            tenants[0].tenant_id, "https://93.184.216.34/hooks")
    leak_watch.add(webhook_secret)
    assert len(_sealed(app_a)) == 8  # five tenants, one previous secret, an admin key, a webhook

    app = ring_app(f"{KEY_B},{KEY_A}")
    runner = app.test_cli_runner()
    first = runner.invoke(args=["secrets", "reseal", "--batch-size", "2", "--max-batches", "1"])
    assert first.exit_code == 0, first.output
    assert first.output.splitlines() == ["tenants 1-2: 2 re-sealed, 0 already sealed with the "
                                         "first key",
                                         "stopped after 1 batches: run again to continue"]
    moved = [token for token in _sealed(app) if _sealed_with(KEY_B, token)]
    assert len(moved) == 2
    # Interrupted: the old key still sealed secrets here, so it must stay in the ring; and the
    # new key sealed some, so the old key alone is refused too.
    assert _check_values(app) == {ring.check_value(KEY_A), ring.check_value(KEY_B)}
    for partial in (KEY_B, KEY_A):
        with pytest.raises(KeyRingMismatch, match=MISMATCH):
            ring_app(partial)

    with app.app_context():
        webhook_id = db.session.execute(text("SELECT id FROM webhook_endpoints")).scalar_one()
        db.session.remove()
    second = runner.invoke(args=["secrets", "reseal", "--batch-size", "2"])
    assert second.exit_code == 0, second.output
    # Each line counts its own batch (the running totals were read as the batch's), the last
    # the whole run.
    assert second.output.splitlines() == [
        "tenants 1-2: 0 re-sealed, 2 already sealed with the first key",
        "tenants 3-4: 2 re-sealed, 0 already sealed with the first key",
        "tenants 5-5: 2 re-sealed, 0 already sealed with the first key",  # and its previous one
        "admin_keys 1-1: 1 re-sealed, 0 already sealed with the first key",
        f"webhook_endpoints {webhook_id}-{webhook_id}: 1 re-sealed, 0 already sealed with the "
        "first key",
        "done: 6 re-sealed, 2 already sealed with the first key; the database now records the "
        "first key only",
    ]
    assert all(_sealed_with(KEY_B, token) and not _sealed_with(KEY_A, token)
               for token in _sealed(app))
    assert _check_values(app) == {ring.check_value(KEY_B)}

    again = runner.invoke(args=["secrets", "reseal"])
    assert again.exit_code == 0 and again.output.endswith(
        "done: 0 re-sealed, 8 already sealed with the first key; the database now records the "
        "first key only\n")

    # The old key is gone from the ring; every secret, the previous one included, still works.
    app_b = ring_app(KEY_B)
    for tenant in tenants:
        assert _verify(app_b, tenant).get_json()["cleared"] is True
    graced = tenants[-1]
    with app_b.app_context():
        row = tenant_service.find_tenant(graced.email)
        assert crypto.unseal(row.previous_signing_secret_sealed).startswith("sig_live_")
        db.session.remove()
    admin_credentials = Credentials(0, "", admin["api_key"], admin["signing_secret"])
    assert _verify(app_b, admin_credentials).get_json()["cleared"] is True
    with pytest.raises(KeyRingMismatch, match=MISMATCH):
        ring_app(KEY_A)


def _seal_behind_the_rings_back(app, email, key):
    """A secret sealed with a key no ring holds, as a local-mode command wrote it before the
    database recorded its keys."""
    with app.app_context():
        db.session.execute(text("UPDATE tenants SET signing_secret_sealed = :sealed"
                                " WHERE email = :email"),
                           {"sealed": Fernet(key).encrypt(b"sig_live_" + b"c" * 64).decode(),
                            "email": email})
        db.session.commit()
        db.session.remove()


def test_a_secret_no_key_unseals_is_a_503_naming_the_tenant(ring_app, leak_watch):
    app = ring_app(KEY_A)
    tenant = _provision(app, leak_watch, "broken@example.com")
    _seal_behind_the_rings_back(app, tenant.email, KEY_C)
    leak_watch.buffer.seek(0)
    leak_watch.buffer.truncate()
    response = _verify(app, tenant)
    assert_envelope(response, 503, "service temporarily unavailable")
    lines = [json.loads(line) for line in leak_watch.buffer.getvalue().splitlines()]
    (logged,) = [line for line in lines if "cannot be unsealed" in line["message"]]
    assert logged["level"] == "ERROR" and logged["tenant_id"] == tenant.tenant_id


def test_rotating_a_secret_no_key_unseals_gives_it_no_grace(ring_app, leak_watch):
    """deploy/README's fix for such a secret is to rotate it. Kept for a grace, it answered
    every verify of the grace 503 still, the new secret's included."""
    app = ring_app(KEY_A)
    tenant = _provision(app, leak_watch, "broken@example.com")
    _seal_behind_the_rings_back(app, tenant.email, KEY_C)
    client = app.test_client()
    rotated = client.post("/v1/tenant/signing-secret/rotate", headers=tenant.headers,
                          json={"grace_seconds": 3600})
    assert rotated.status_code == 200 and rotated.get_json()["previous_valid_until"] is None
    leak_watch.add(rotated.get_json()["signing_secret"])
    renewed = dataclasses.replace(tenant, signing_secret=rotated.get_json()["signing_secret"])
    assert _verify(app, renewed).get_json()["cleared"] is True
    lines = [json.loads(line) for line in leak_watch.buffer.getvalue().splitlines()]
    (said,) = [line for line in lines if "rotated without a grace" in line["message"]]
    assert said["level"] == "WARNING" and said["tenant_id"] == tenant.tenant_id
    entries = client.get("/v1/tenant/audit-log", headers=tenant.headers).get_json()["entries"]
    assert entries[0]["action"] == "signing_secret.rotated"
    assert entries[0]["details"]["grace_seconds"] == 0


def test_reseal_names_a_secret_no_key_unseals_and_keeps_the_recorded_keys(ring_app, leak_watch):
    app = ring_app(KEY_A)
    tenant = _provision(app, leak_watch, "broken@example.com")
    _provision(app, leak_watch, "fine@example.com")
    _seal_behind_the_rings_back(app, tenant.email, KEY_C)
    app = ring_app(f"{KEY_B},{KEY_A}")
    result = app.test_cli_runner().invoke(args=["secrets", "reseal"])
    assert result.exit_code == 1
    assert (f"tenants {tenant.tenant_id}: signing_secret_sealed cannot be unsealed with any key "
            "of the ring (add the key that sealed it, or rotate it)") in result.stderr
    assert "done" not in result.stdout
    # KEY_A may not leave the ring yet, and KEY_B sealed the other secret meanwhile.
    assert _check_values(app) == {ring.check_value(KEY_A), ring.check_value(KEY_B)}


def test_a_seal_refuses_a_ring_the_start_could_not_check(base_settings, tmp_path, leak_watch):
    """The start check found no database; by the first seal another ring's secrets are there:
    nothing is sealed, the caller gets a 503 (HTTP) or one line and status 3 (CLI)."""
    url = "sqlite:///" + str(tmp_path / "later.db")
    settings = {**base_settings, "SQLALCHEMY_DATABASE_URI": url, "REDIS_URL": None}
    early = create_app({**settings, "SECRET_ENCRYPTION_KEY": KEY_B})
    owner = create_app({**settings, "SECRET_ENCRYPTION_KEY": KEY_A})
    with owner.app_context():
        upgrade()
    _provision(owner, leak_watch, "owner@example.com")
    admin = _admin_key(owner, leak_watch, "internal")
    created = early.test_client().post("/v1/admin/tenants", json={"email": "x@example.com"},
                                       headers={"X-Service-Key": admin["api_key"]})
    assert_envelope(created, 503, "service temporarily unavailable")
    result = early.test_cli_runner().invoke(args=["tenants", "create", "--email", "y@example.com"])
    assert result.exit_code == 3
    assert result.stderr.startswith(f"Configuration error: {MISMATCH}")
    assert len(_sealed(owner)) == 2 and _check_values(owner) == {ring.check_value(KEY_A)}
    for app in (early, owner):
        with app.app_context():
            db.engine.dispose()
        app.extensions["database"].engine.dispose()


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="a database reached over a socket")
def test_a_ring_the_start_could_not_check_is_checked_once_the_database_answers(
        ring_app, base_settings, empty_database_url, leak_watch, caplog):
    """Started while the database did not answer, a process with a ring that cannot unseal
    its secrets served on, its /health 200, while each of their tenants got a 503. Once the
    database answers, /health checks the ring as the start would have: unhealthy, said once."""
    owner = ring_app(KEY_A)
    _provision(owner, leak_watch, "owner@example.com")
    url = make_url(empty_database_url)
    apps, port = {}, free_port()  # nothing listens there yet: the start finds no database
    with caplog.at_level("WARNING", logger="app.keyring.checks"):
        for ring_text in (KEY_B, f"{KEY_B},{KEY_A}"):
            apps[ring_text] = create_app({
                **base_settings, "REDIS_URL": None, "SECRET_ENCRYPTION_KEY": ring_text,
                "SQLALCHEMY_DATABASE_URI": url.set(host="127.0.0.1", port=port)
                .render_as_string(hide_password=False)})
    assert [record.message for record in caplog.records if record.name == "app.keyring.checks"
            ] == ["secret key check deferred: database unavailable"] * 2
    caplog.clear()
    proxy = FreezableProxy(url.host or "127.0.0.1", url.port or 5432, listen_port=port)
    try:
        with caplog.at_level("WARNING", logger="app.keyring.checks"):
            for _ in range(2):  # the second asks nothing: said once
                answer = apps[KEY_B].test_client().get("/health")
                assert answer.status_code == 503
                assert answer.get_json()["checks"] == {
                    "database": "ok", "rate_limit_store": "ok", "secret_keys": "mismatch"}
                right = apps[f"{KEY_B},{KEY_A}"].test_client().get("/health")
                assert right.status_code == 200 and right.get_json() == {
                    "status": "ok", "checks": {"database": "ok", "rate_limit_store": "ok"}}
        said = [record for record in caplog.records if record.levelname == "ERROR"
                and record.name == "app.keyring.checks"]
        assert len(said) == 1 and said[0].message.startswith(MISMATCH)
    finally:
        for app in apps.values():
            with app.app_context():
                db.engine.dispose()
            app.extensions["database"].engine.dispose()
        proxy.close()


def _sealed_environment(database_url, revision="head"):
    """A process environment on a database migrated to `revision`, holding a tenant whose
    secret KEY_A sealed (made by `flask` commands, as an operator would)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GUNICORN_", "TLS_", "FLASK_", "SECRET_"))}
    env.update(DATABASE_URL=database_url, REDIS_URL="", FLASK_APP="wsgi",
               SECRET_ENCRYPTION_KEY=KEY_A)
    assert _flask(env, "db", "upgrade", revision).returncode == 0
    if revision == "head":
        assert _flask(env, "tenants", "create", "--email", "a@example.com").returncode == 0
        return env
    # Today's code writes rows for today's schema: the tenant as that release stored it.
    engine = create_engine(normalize_database_url(database_url))
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO tenants (email, plan, active, signing_secret_sealed, signature_scheme,"
            " created_at) VALUES ('a@example.com', 'free', :active, :sealed, 'bound',"
            " CURRENT_TIMESTAMP)"),
            {"active": True, "sealed": Fernet(KEY_A).encrypt(b"sig_live_" + b"a" * 64).decode()})
    engine.dispose()
    return env


@pytest.fixture
def environment(empty_database_url):
    return _sealed_environment(empty_database_url)


def _flask(env, *args):
    return subprocess.run([sys.executable, "-m", "flask", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _refused(result):
    assert result.returncode == 3 and result.stdout == "", result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Configuration error: {MISMATCH}")
    assert KEY_A not in line and KEY_B not in line
    return line


def test_a_wrong_key_stops_every_flask_command_with_one_line(environment):
    environment["SECRET_ENCRYPTION_KEY"] = f"{KEY_B},{KEY_C}"
    for command in (("tenants", "list"), ("tenants", "rotate-signing-secret", "a@example.com"),
                    ("secrets", "reseal"), ("db", "upgrade")):
        _refused(_flask(environment, *command))


def test_local_mode_never_seals_into_a_database_with_other_keys(environment):
    """No SECRET_ENCRYPTION_KEY: the instance's generated key, which is not the database's."""
    del environment["SECRET_ENCRYPTION_KEY"]
    line = _refused(_flask(environment, "tenants", "rotate-signing-secret", "a@example.com"))
    assert "local mode's own key (instance/secret-encryption.key)" in line


def test_a_wrong_key_stops_the_service_with_one_line(environment):
    environment["SECRET_ENCRYPTION_KEY"] = KEY_B
    _refused(subprocess.run([sys.executable, "-c", "import wsgi"], cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=60))
    environment.update(GUNICORN_BIND=f"127.0.0.1:{free_port()}", GUNICORN_WORKERS="1")
    _refused(subprocess.run([sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py",
                             "wsgi:app"], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=120))


def test_the_right_ring_starts_every_entry_point(environment):
    environment["SECRET_ENCRYPTION_KEY"] = f"{KEY_B},{KEY_A}"
    for command in (("db", "upgrade"), ("tenants", "list")):
        result = _flask(environment, *command)
        assert result.returncode == 0, result.stderr
    assert subprocess.run([sys.executable, "-c", "import wsgi"], cwd=ROOT, env=environment,
                          capture_output=True, timeout=60).returncode == 0


def test_an_upgrade_with_a_wrong_key_leaves_an_older_database_as_it_was(empty_database_url):
    """A database from before the check values gets them from `flask db upgrade`: the keys of
    the ring that unseal its secrets; a ring of which none does undoes the upgrade."""
    environment = _sealed_environment(empty_database_url, BEFORE_KEY_CHECKS)
    environment["SECRET_ENCRYPTION_KEY"] = KEY_B
    _refused(_flask(environment, "db", "upgrade"))
    environment["SECRET_ENCRYPTION_KEY"] = KEY_A
    assert BEFORE_KEY_CHECKS in _flask(environment, "db", "current").stdout
    upgraded = _flask(environment, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    environment["SECRET_ENCRYPTION_KEY"] = KEY_B  # now refused at start, by the recorded value
    _refused(_flask(environment, "db", "current"))


def test_a_worker_started_after_another_process_sealed_with_a_newer_key_keeps_serving(
        environment, tmp_path):
    """A host still on the old ring while another already seals with the new key: a worker its
    master starts then (one recycled after max_requests) finds a key it lacks recorded. It says
    so and serves, and its /health says so; the master, which checked the ring before its first
    worker, stays up."""
    environment.update(GUNICORN_MAX_REQUESTS="2", GUNICORN_MAX_REQUESTS_JITTER="0")
    server = GunicornServer(tmp_path / "gunicorn.log", environment, workers=1).start()
    try:
        newer = {**environment, "SECRET_ENCRYPTION_KEY": f"{KEY_B},{KEY_A}"}
        sealed = _flask(newer, "tenants", "rotate-signing-secret", "a@example.com")
        assert sealed.returncode == 0, sealed.stderr
        # The worker is replaced after every second request: the first, started before the
        # new key sealed, may answer one or two of them (its start was checked); every worker
        # after it finds the key it lacks.
        answers = [requests.get(server.url + "/health", timeout=30) for _ in range(6)]
        statuses = [answer.status_code for answer in answers]
        started_before = statuses.count(200)
        assert started_before <= 2 and statuses == [200] * started_before + [503] * (
            6 - started_before), statuses
        for answer in answers[started_before:]:
            _assert_mismatch_said(answer)
    finally:
        server.stop()
    said = [record for record in server.log_records() if record["level"] == "ERROR"]
    assert said and all(record["message"].startswith(MISMATCH) for record in said)


def test_a_reload_after_another_process_sealed_with_a_newer_key_keeps_serving(environment,
                                                                              tmp_path):
    """SIGHUP re-reads the settings in the running master, checks included: a ring that now
    lacks a key another process seals with is said, not a reason to exit (gunicorn's master
    would stop, and its workers with it: the host down until the ring is fixed)."""
    server = GunicornServer(tmp_path / "gunicorn.log", environment, workers=1).start()
    try:
        newer = {**environment, "SECRET_ENCRYPTION_KEY": f"{KEY_B},{KEY_A}"}
        sealed = _flask(newer, "tenants", "rotate-signing-secret", "a@example.com")
        assert sealed.returncode == 0, sealed.stderr
        log = tmp_path / "gunicorn.log"
        server.process.send_signal(signal.SIGHUP)
        for _ in range(300):  # the reload boots a new worker: wait for it (30 s at most)
            if log.read_text().count("Booting worker") == 2 or server.process.poll() is not None:
                break
            time.sleep(0.1)
        assert server.process.poll() is None, log.read_text()[-2000:]
        assert log.read_text().count("Booting worker") == 2
        _assert_mismatch_said(requests.get(server.url + "/health", timeout=30))
    finally:
        server.stop()
    said = [record for record in server.log_records() if record["level"] == "ERROR"]
    assert said and all(record["message"].startswith(MISMATCH) for record in said)


def _assert_mismatch_said(health):
    """/health as after a start that found the database down and then this ring wanting: the
    same ring gets the same answer, whichever found it (it was 200 here, and 503 there)."""
    assert health.status_code == 503, health.text
    assert health.json()["checks"] == {"database": "ok", "rate_limit_store": "ok",
                                       "secret_keys": "mismatch"}


def test_a_running_process_whose_ring_lacks_a_key_another_now_seals_with_is_unhealthy(
        ring_app, leak_watch, caplog):
    """A process started on the old ring while another, its ring changed first, seals with
    the new key: its tenants get 503s from this process, and its /health said 200. The
    database's record of the sealing keys says so at once."""
    running = ring_app(KEY_A)
    healthy = running.test_client().get("/health")
    assert healthy.status_code == 200, healthy.get_json()
    _provision(ring_app(f"{KEY_B},{KEY_A}"), leak_watch, "newer@example.com")  # sealed with B
    with caplog.at_level("ERROR", logger="app.health"):
        for _ in range(2):  # said once
            answer = running.test_client().get("/health")
            assert answer.status_code == 503
            assert answer.get_json()["checks"] == {
                "database": "ok", "rate_limit_store": "ok", "secret_keys": "mismatch"}
    said = [record.message for record in caplog.records if record.name == "app.health"]
    assert len(said) == 1 and said[0].startswith(MISMATCH)
    assert ring_app(f"{KEY_B},{KEY_A}").test_client().get("/health").status_code == 200
    # A reseal with KEY_A first: the database records KEY_A alone, which the running process
    # holds. It is healthy again without a restart (a probe: only a restart ended its 503s).
    resealed = ring_app(f"{KEY_A},{KEY_B}").test_cli_runner().invoke(args=["secrets", "reseal"])
    assert resealed.exit_code == 0, resealed.output
    caplog.clear()
    with caplog.at_level("WARNING", logger="app.health"):
        for _ in range(2):
            healthy = running.test_client().get("/health")
            assert healthy.status_code == 200, healthy.get_json()
    assert [record.message for record in caplog.records if record.name == "app.health"] == [
        "SECRET_ENCRYPTION_KEY holds every key the database records again"]
