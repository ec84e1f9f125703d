"""Config, request ids, the error envelope, health."""
import json
import socket
import threading
import time

import pytest
from cryptography.fernet import Fernet
from sqlalchemy.engine import make_url

from app import config, create_app, statement_deadline
from app.config import ConfigError
from tests.conftest import TEST_DATABASE_URL
from tests.servers import FreezableProxy
from tests.support import assert_envelope, postgresql_connection

KEY_NEW, KEY_OLD = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def _respelled(key):
    """The same key, its last character's two low bits (which decode to nothing) flipped."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return key[:42] + alphabet[alphabet.index(key[42]) ^ 3] + "="


def test_default_config_is_not_testing(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    app = create_app({"SECRET_ENCRYPTION_KEY": None})
    assert not app.testing
    assert app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite:///")
    assert app.config["SQLALCHEMY_DATABASE_URI"].endswith("instance/intentgate.db")
    assert app.config["MULTI_TENANCY"] is True
    assert app.config["CORS_ORIGINS"] == []


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("CLOCK_SKEW_SECONDS", "soon", "CLOCK_SKEW_SECONDS must be an integer"),
        ("MULTI_TENANCY", "maybe", "MULTI_TENANCY must be true or false"),
        ("DATABASE_URL", "mysql://x/y", "DATABASE_URL must be a sqlite:// or postgresql:// URL"),
        ("DATABASE_URL", "postgresqlx://x/y", "DATABASE_URL must be a sqlite:// or postgresql://"),
        ("DATABASE_URL", "postgresql+asyncpg://x/y", "DATABASE_URL must be a sqlite:// or "),
        ("DATABASE_URL", "postgresql://me:pw@db:port/x", "DATABASE_URL is not a valid URL"),
        ("REDIS_URL", "redis://127.0.0.1:6379/abc",
         "REDIS_URL's database index must be a number, got 'abc'"),
        ("REDIS_URL", "redis://127.0.0.1:6379?db=x", "REDIS_URL's database index must be a number"),
        ("REDIS_URL", "redis://127.0.0.1:redis/0", "REDIS_URL's port must be a number"),
        ("REDIS_URL", "http://127.0.0.1:6379/0", r"REDIS_URL must be a redis://, rediss://, "
                                                 r"redis\+cluster:// or redis\+sentinel:// URL"),
        ("REDIS_URL", "127.0.0.1:6379", "REDIS_URL must be a redis://"),
        ("REDIS_URL", "redis:///0", "REDIS_URL must name a host"),
        ("SECRET_ENCRYPTION_KEY", "not-a-key", "SECRET_ENCRYPTION_KEY must be a Fernet key"),
        # A ring with the wrong separator: Fernet alone would take it as its first key.
        ("SECRET_ENCRYPTION_KEY", f"{KEY_NEW};{KEY_OLD}", "SECRET_ENCRYPTION_KEY must be a "
                                                          "Fernet key"),
        ("SECRET_ENCRYPTION_KEY", f"{KEY_NEW} {KEY_OLD}", "SECRET_ENCRYPTION_KEY must be a "
                                                          "Fernet key"),
        ("SECRET_ENCRYPTION_KEY", f"{KEY_NEW},{KEY_OLD}x", "key 2 of the ring is not one"),
        # The same key twice: a rotation that made no new key.
        ("SECRET_ENCRYPTION_KEY", f"{KEY_NEW}, {KEY_OLD},{KEY_NEW}",
         "^SECRET_ENCRYPTION_KEY: key 3 of the ring repeats key 1$"),
        # Spelled otherwise: the last character's two low bits decode to nothing.
        ("SECRET_ENCRYPTION_KEY", f"{KEY_NEW},{_respelled(KEY_NEW)}",
         "^SECRET_ENCRYPTION_KEY: key 2 of the ring repeats key 1$"),
        ("RATE_LIMIT_CAPACITY", "0", "^RATE_LIMIT_CAPACITY must be at least 1, got 0$"),
        ("LOG_LEVEL", "bogus", r"^LOG_LEVEL must be a level name of Python's logging \(DEBUG, "
                               r"INFO, WARNING, ERROR, CRITICAL\), got 'BOGUS'$"),
        # Flask-CORS would read these as regular expressions matched at the Origin's start.
        ("CORS_ORIGINS", "https://*.acme.example", "CORS_ORIGINS must list origins such as"),
        ("CORS_ORIGINS", "https://a.example,https://a.example(", "got 'https://a.example\\('"),
        ("CORS_ORIGINS", "https://app.example/path", "no wildcard or path"),
        # Timeouts and intervals: a 0 timeout fails every call at once, 0 is a busy loop.
        ("REDIS_SOCKET_TIMEOUT", "0", "REDIS_SOCKET_TIMEOUT must be more than 0 seconds"),
        ("WEBHOOK_TIMEOUT", "-1", "WEBHOOK_TIMEOUT must be more than 0 seconds"),
        ("WEBHOOK_POLL_SECONDS", "nan", "WEBHOOK_POLL_SECONDS must be more than 0 seconds"),
        ("SMTP_TIMEOUT", "inf", "SMTP_TIMEOUT must be more than 0 seconds"),
        ("CONTEXT_STORE_READ_TIMEOUT", "soon", "CONTEXT_STORE_READ_TIMEOUT must be a number of"),
        ("WEBHOOK_RETRY_DELAYS", "5,nan", "WEBHOOK_RETRY_DELAYS must hold finite delays"),
        ("WEBHOOK_RETRY_DELAYS", "inf", "WEBHOOK_RETRY_DELAYS must hold finite delays"),
        ("WEBHOOK_RETRY_DELAYS", "5,-1", "WEBHOOK_RETRY_DELAYS must hold finite delays"),
        ("WEBHOOK_CA_FILE", "/nonexistent/ca.pem", "WEBHOOK_CA_FILE names no readable file"),
        ("AUTH_FAILURE_LIMIT", "lots", "AUTH_FAILURE_LIMIT must look like '20 per minute'"),
        ("DEPLOYMENT_MODE", "staging", "DEPLOYMENT_MODE must be 'local' or 'production'"),
        ("REDIS_URL", "memcached://127.0.0.1:11211", "REDIS_URL must be a redis://, rediss://"),
        ("REDIS_URL", "redis+sentinel://127.0.0.1:26379", "REDIS_URL must look like "
                                                          "redis\\+sentinel://"),
        # urlsplit's own ValueError (a lone "[") is one line naming the setting too.
        ("DATABASE_URL", "postgresql://u:pw@[::1/db", "^DATABASE_URL is not a valid URL"),
        ("REDIS_URL", "redis://[::1/0", "^REDIS_URL is not a valid URL"),
        ("CONTEXT_STORE_URL", "http://[::1/", "^CONTEXT_STORE_URL is not a valid URL"),
        ("CONTEXT_STORE_URL", "localhost:8080", "CONTEXT_STORE_URL must be an absolute http"),
        ("CONTEXT_STORE_URL", "ftp://store.example/ctx", "CONTEXT_STORE_URL must be an absolute"),
        ("CONTEXT_STORE_URL", "http:///ctx", "must be an absolute http:// or https:// URL with a"),
        ("CONTEXT_STORE_URL", "http://store:port/ctx", "CONTEXT_STORE_URL's port must be a"),
        # requests would send them as Basic credentials, in place of the user's token.
        ("CONTEXT_STORE_URL", "http://user:pw@store.internal/ctx",
         "^CONTEXT_STORE_URL must not hold a user name or password: the user's token is what "
         r"the store is sent \(Authorization: Bearer\)$"),
        ("CONTEXT_STORE_URL", "http://user@store.internal/ctx", "must not hold a user name"),
        # Doubled while the store stays silent up to a minute: a first break is no longer.
        ("CONTEXT_STORE_BREAK_SECONDS", "61", "^CONTEXT_STORE_BREAK_SECONDS must be at most 60 "
                                              "seconds, got '61'$"),
    ],
)
def test_bad_settings_fail_fast(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        create_app()


@pytest.mark.parametrize("name", ["warn", "FATAL", "notset", "Debug"])
def test_every_level_name_logging_takes_is_a_log_level(monkeypatch, name):
    monkeypatch.setenv("LOG_LEVEL", name)
    assert create_app().config["LOG_LEVEL"] == name.upper()


def test_a_bad_database_url_is_refused_without_its_password(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://me:hunter2-secret@db:port/x")
    with pytest.raises(ConfigError) as refused:
        create_app()
    assert "hunter2-secret" not in str(refused.value)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/",
                                 "rediss://:pw@cache.internal:6380/15", "redis://h:1?db=3",
                                 "redis+cluster://a:7000,b:7001",
                                 "redis+sentinel://s1:26379,s2:26379/primary/0"])
def test_every_redis_url_form_the_contract_names_is_accepted(monkeypatch, tmp_path, url):
    monkeypatch.setenv("REDIS_URL", url)
    config.validate(config.from_environment(str(tmp_path)))


def test_production_refuses_webhooks_to_private_addresses(monkeypatch, tmp_path):
    """The SSRF filter's switch is for development and tests (CONTRACT.md): in production it
    would let a tenant's webhook URL reach the service's own network."""
    monkeypatch.setenv("DEPLOYMENT_MODE", "production")
    monkeypatch.setenv("SECRET_ENCRYPTION_KEY", Fernet.generate_key().decode())
    monkeypatch.setenv("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true")
    with pytest.raises(ConfigError, match="WEBHOOK_ALLOW_PRIVATE_ADDRESSES is for development"):
        config.validate(config.from_environment(str(tmp_path)))
    monkeypatch.setenv("DEPLOYMENT_MODE", "local")
    settings = config.from_environment(str(tmp_path))
    config.validate(settings)
    assert settings["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] is True


def test_production_requires_an_encryption_key(monkeypatch):
    monkeypatch.setenv("DEPLOYMENT_MODE", "production")
    monkeypatch.delenv("SECRET_ENCRYPTION_KEY", raising=False)
    with pytest.raises(ConfigError, match="SECRET_ENCRYPTION_KEY is required in production"):
        create_app()


def test_health_reports_its_checks(client):
    response = client.get("/health")
    assert response.status_code == 200
    assert response.get_json() == {
        "status": "ok",
        "checks": {"database": "ok", "rate_limit_store": "ok"},
    }
    assert len(response.headers["X-Request-Id"]) == 32


def test_health_is_503_when_the_database_is_gone(settings, migrated, tmp_path):
    settings["SQLALCHEMY_DATABASE_URI"] = "postgresql://nobody@127.0.0.1:1/none"
    app = create_app(settings)
    response = app.test_client().get("/health")
    body = assert_envelope(response, 503, "service unavailable")
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "unavailable"


def test_metrics_are_served_while_the_database_is_gone(settings, migrated):
    """Only the webhook gauges come from the database: the request metrics, wanted most in an
    outage, are served without them."""
    settings.update(SQLALCHEMY_DATABASE_URI="postgresql://nobody@127.0.0.1:1/none",
                    METRICS_ENABLED=True)
    client = create_app(settings).test_client()
    assert client.get("/health").status_code == 503
    response = client.get("/metrics")
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    assert 'intentgate_http_requests_total{endpoint="/health",method="GET",status="503"}' in text
    assert "intentgate_webhook_attempts" not in text


def test_a_database_that_stops_answering_is_a_503_within_the_statement_deadline(
        settings, migrated):
    """libpq waits in C with no timeout: without a deadline the request would hang until
    gunicorn killed the worker (no answer at all), here until the proxy thaws."""
    if not TEST_DATABASE_URL:
        pytest.skip("a database reached over a socket (TEST_DATABASE_URL)")
    url = make_url(TEST_DATABASE_URL)
    proxy = FreezableProxy(url.host or "127.0.0.1", url.port or 5432)
    settings["SQLALCHEMY_DATABASE_URI"] = url.set(
        host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings["DATABASE_STATEMENT_SECONDS"] = 1
    client = create_app(settings).test_client()
    try:
        assert client.get("/health").status_code == 200  # this thread's connection, open
        proxy.freeze()
        # Should the deadline fail, the proxy thaws in 10 s rather than the test hang.
        thawing = threading.Timer(10, proxy.thaw)
        thawing.start()
        started = time.monotonic()
        answer = client.get("/health")  # on the connection kept open, now frozen
        waited = time.monotonic() - started
        thawing.cancel()
        proxy.thaw()
        body = assert_envelope(answer, 503, "service unavailable")
        assert body["checks"]["database"] == "unavailable"
        assert waited < 5, waited
        # The pool was dropped with the cut connection: the next request reconnects.
        assert client.get("/health").status_code == 200
    finally:
        proxy.close()


@pytest.mark.parametrize("statement_seconds, bound, cause", [
    (1, 4, "database unavailable"),  # the statement deadline comes first: a disconnect
    (20, 9, "canceling statement due to lock timeout"),  # the lock timeout (5 s) first
])
def test_a_session_statement_held_by_a_stuck_transaction_is_a_503(
        settings, make_tenant, capfd, statement_seconds, bound, cause):
    """The ORM session's statements (here a key creation, which locks the tenant's row) are
    bounded as the request path's are: a lock a stuck transaction holds would otherwise keep
    the request waiting until gunicorn killed the worker, with no answer at all."""
    if not TEST_DATABASE_URL:
        pytest.skip("a database reached over a socket (TEST_DATABASE_URL)")
    tenant = make_tenant("pro")
    client = create_app({**settings, "DATABASE_STATEMENT_SECONDS": statement_seconds}
                        ).test_client()
    stuck = postgresql_connection()
    try:
        stuck.cursor().execute("SELECT id FROM tenants WHERE id = %s FOR UPDATE",
                               (tenant.tenant_id,))
        answers = []
        asking = threading.Thread(target=lambda: answers.append(client.post(
            "/v1/tenant/keys", headers=tenant.headers, json={"name": "ci"})))
        started = time.monotonic()
        asking.start()
        asking.join(timeout=bound + 10)
        waited = time.monotonic() - started
    finally:
        stuck.rollback()
        stuck.close()
    asking.join(timeout=30)
    assert_envelope(answers[0], 503, "service temporarily unavailable")
    assert waited < bound, waited
    assert cause in capfd.readouterr().err
    # Nothing was written, and a cut connection was dropped: the next request succeeds.
    listed = client.get("/v1/tenant/keys", headers=tenant.headers).get_json()["keys"]
    assert [key["name"] for key in listed] == ["default"]
    assert client.post("/v1/tenant/keys", headers=tenant.headers,
                       json={"name": "ci"}).status_code == 201


def test_a_statement_cut_as_its_answer_came_is_reported_as_cut():
    """The watcher may cut a connection just after its statement was answered: the answer
    stands, but the connection is dead, and the caller must be told so that it does not go
    back to the pool (app.database drops it) for a later request to fail on."""
    ours, theirs = socket.socketpair()
    try:
        statement_deadline.start(ours, 0)
        theirs.settimeout(5)
        assert theirs.recv(1) == b""  # the watcher shut our end down: the peer reads its end
        assert statement_deadline.stop() is True
        statement_deadline.start(ours, 60)
        assert statement_deadline.stop() is False
    finally:
        ours.close()
        theirs.close()


def test_a_database_failure_is_logged_with_its_cause_and_never_the_password(settings, migrated,
                                                                            tmp_path, capfd):
    if TEST_DATABASE_URL:
        settings["SQLALCHEMY_DATABASE_URI"] = make_url(TEST_DATABASE_URL).set(
            database="no_such_database", password="hunter2-secret").render_as_string(False)
        cause = 'database "no_such_database" does not exist'
    else:
        (tmp_path / "a-directory").mkdir()
        settings["SQLALCHEMY_DATABASE_URI"] = "sqlite:///" + str(tmp_path / "a-directory")
        cause = "unable to open database file"
    app = create_app(settings)
    capfd.readouterr()
    assert app.test_client().get("/health").status_code == 503
    err = capfd.readouterr().err
    (line,) = [json.loads(line) for line in err.splitlines()
               if line.startswith("{") and "database unavailable" in line]
    assert line["failure"] == "OperationalError" and cause in line["cause"], line
    assert "hunter2-secret" not in err


def test_caller_request_id_is_echoed_and_bad_ones_replaced(client):
    assert client.get("/health", headers={"X-Request-Id": "abc.DEF-123_x"}).headers[
        "X-Request-Id"] == "abc.DEF-123_x"
    replaced = client.get("/health", headers={"X-Request-Id": "bad id with spaces"})
    assert replaced.headers["X-Request-Id"] != "bad id with spaces"
    assert len(replaced.headers["X-Request-Id"]) == 32


def test_unknown_path_is_a_json_404(client):
    assert_envelope(client.get("/v1/nothing-here"), 404, "not found")


def test_paths_are_not_redirected_nor_hold_control_characters(client, tenant):
    # werkzeug would merge "//" with an HTML 308 whose Location comes from the Host header.
    doubled = client.post("/v1//intent/generate", json={"user_token": "a" * 20},
                          headers={**tenant.headers, "Host": "evil.example"})
    assert_envelope(doubled, 404, "not found")
    assert "Location" not in doubled.headers
    # Leading slashes too: werkzeug's routing would strip them and serve the usage.
    for path in ("//v1/tenant/usage", "///v1/tenant/usage", "//health"):
        assert_envelope(client.get("/", headers=tenant.headers,
                                   environ_overrides={"PATH_INFO": path}), 404, "not found")
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200
    # A key id with a NUL or another control character names no key (the database would
    # refuse the NUL with an error of its own).
    for key_id in ("%00", "ab%01cd", "%7F"):
        assert_envelope(client.delete(f"/v1/tenant/keys/{key_id}", headers=tenant.headers),
                        404, "not found")
        assert_envelope(client.delete(f"/v1/tenant/signing-keys/{key_id}",
                                      headers=tenant.headers), 404, "not found")


def test_automatic_options_answers_are_json(client):
    for path, allowed in (("/health", ["GET", "HEAD", "OPTIONS"]),
                          ("/v1/intent/generate", ["OPTIONS", "POST"])):
        response = client.options(path)
        assert response.status_code == 200 and response.mimetype == "application/json"
        assert response.get_json() == {"allow": allowed}
        assert set(response.headers["Allow"].split(", ")) == set(allowed)
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_wrong_method_is_a_json_405_with_allow(client):
    response = client.get("/v1/tenant/rotate-key")
    assert_envelope(response, 405, "method not allowed")
    assert "POST" in response.headers["Allow"]


def test_oversized_body_is_413(client, tenant):
    response = client.post("/v1/tenant/rotate-key", headers=tenant.headers,
                           data="x" * (65 * 1024), content_type="application/json")
    assert_envelope(response, 413, "request body too large (limit 64 KiB)")


def test_unexpected_errors_are_a_json_500_without_details(app, client, caplog):
    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals")

    response = client.get("/boom", headers={"X-Request-Id": "trace-500"})
    body = assert_envelope(response, 500, "internal server error")
    assert "secret internals" not in response.get_data(as_text=True)
    assert body["request_id"] == "trace-500"


def test_log_lines_are_json_with_the_request_id(app, client, capfd):
    client.get("/health", headers={"X-Request-Id": "log-check-1"})
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()
             if line.startswith("{")]
    access = [line for line in lines if line.get("logger") == "app.access"]
    assert access and access[-1]["request_id"] == "log-check-1"
    assert access[-1]["status"] == 200 and access[-1]["path"] == "/health"


def test_a_key_or_secret_in_the_path_is_masked_in_the_access_line(client, tenant, leak_watch,
                                                                  capfd):
    """A client passing its key where a key id belongs gets its 404; the log keeps no key."""
    leak_watch.add(tenant.api_key)
    for credential in (tenant.api_key, tenant.signing_secret):
        response = client.delete(f"/v1/tenant/keys/{credential}", headers=tenant.headers)
        assert_envelope(response, 404, "API key not found")
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()
             if line.startswith("{")]
    paths = [line["path"] for line in lines if line.get("logger") == "app.access"]
    assert paths[-2:] == ["/v1/tenant/keys/key_live_[redacted]",
                          "/v1/tenant/keys/sig_live_[redacted]"]


def test_an_unhandled_error_is_one_json_line_with_its_traceback(app, client, capfd):
    @app.get("/boom-logged")
    def boom():
        raise RuntimeError("deep inside")

    assert client.get("/boom-logged", headers={"X-Request-Id": "log-check-2"}).status_code == 500
    err = capfd.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    (error,) = [line for line in lines if line["message"] == "unhandled error"]
    assert error["level"] == "ERROR" and error["request_id"] == "log-check-2"
    assert error["exc_info"].startswith("Traceback")
    assert "RuntimeError: deep inside" in error["exc_info"]
    assert {"time", "logger", "pid"} <= error.keys()


def test_protective_headers_on_every_kind_of_response(app, client, tenant):
    @app.get("/boom-headers")
    def boom():
        raise RuntimeError("unexpected")

    responses = [client.get("/health"), client.get("/nowhere"), client.delete("/health"),
                 client.get("/boom-headers"), client.get("/v1/tenant/usage"),
                 client.post("/v1/intent/verify", headers=tenant.headers, data="x" * 70_000,
                             content_type="application/json"),
                 client.get("/v1/tenant/usage", headers=tenant.headers)]
    assert [r.status_code for r in responses] == [200, 404, 405, 500, 401, 413, 200]
    for response in responses:
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert len(response.headers.getlist("X-Request-Id")) == 1
        assert "Server" not in response.headers  # gunicorn's own is set in its config
    # Responses that can carry a credential (and every other API answer) are never cached.
    rotated = client.post("/v1/tenant/rotate-key", headers=tenant.headers)
    assert rotated.status_code == 200 and rotated.headers["Cache-Control"] == "no-store"
    assert responses[-1].headers["Cache-Control"] == "no-store"
