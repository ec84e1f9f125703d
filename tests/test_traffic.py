"""Request rate per tenant, the auth-failure limit per address, proxies, CORS, Redis outages."""
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app import create_app
from app.extensions import db
from app.sql import unit_of_work
from tests.servers import free_port
from tests.support import assert_envelope

BAD_KEY = {"X-Service-Key": "key_live_" + "3" * 48}


def test_every_v1_response_has_rate_headers(client, tenant):
    response = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert response.headers["X-RateLimit-Limit"] == "100"
    assert response.headers["X-RateLimit-Remaining"] == "99"
    assert int(response.headers["X-RateLimit-Reset"]) >= int(time.time())
    second = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert second.headers["X-RateLimit-Remaining"] == "98"
    failed = client.get("/v1/tenant/usage", headers=BAD_KEY)
    assert failed.headers["X-RateLimit-Limit"] == "20"
    assert "X-RateLimit-Limit" not in client.get("/health").headers


def test_v1_answers_before_authentication_show_the_address_bucket_unspent(client, tenant):
    # No such endpoint or method, a preflight: answered before any key is read, so the
    # headers are the client address's failure bucket (20 a minute here), spending nothing.
    for _ in range(2):
        for response in (client.get("/v1/nothing-here", headers=tenant.headers),
                         client.put("/v1/tenant/usage", headers=tenant.headers),
                         client.options("/v1/intent/generate")):
            assert response.status_code in (404, 405, 200)
            assert response.headers["X-RateLimit-Limit"] == "20"
            assert response.headers["X-RateLimit-Remaining"] == "20"
            assert int(response.headers["X-RateLimit-Reset"]) >= int(time.time())
    assert client.get("/v1/tenant/usage", headers=BAD_KEY).status_code == 401
    after_a_failure = client.get("/v1/nothing-here")
    assert after_a_failure.headers["X-RateLimit-Remaining"] == "19"
    # The tenant's own bucket was not touched by any of them.
    usage = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert usage.headers["X-RateLimit-Remaining"] == "99"


def test_the_bucket_empties_and_refills(app, client, tenant):
    app.config.update(RATE_LIMIT_CAPACITY=5, RATE_LIMIT_REFILL_PER_MINUTE=60)
    statuses = [client.get("/v1/tenant/usage", headers=tenant.headers).status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    limited = client.get("/v1/tenant/usage", headers=tenant.headers)
    body = assert_envelope(limited, 429, "rate limit exceeded")
    assert body["retry_after"] == 1 and limited.headers["Retry-After"] == "1"
    assert limited.headers["X-RateLimit-Remaining"] == "0"
    time.sleep(1.1)
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 429


def test_a_refused_request_is_one_log_line(app, client, tenant, caplog):
    """The access line says 429; Flask-Limiter's own "ratelimit ... exceeded" line, one more
    for every refused request, doubled the log under a flood."""
    app.config.update(RATE_LIMIT_CAPACITY=1, RATE_LIMIT_REFILL_PER_MINUTE=1)
    caplog.set_level("INFO")
    statuses = [client.get("/v1/tenant/usage", headers=tenant.headers).status_code
                for _ in range(3)]
    assert statuses == [200, 429, 429]
    assert [record.name for record in caplog.records] == ["app.access"] * 3


def test_buckets_are_per_tenant_and_survive_key_rotation(app, client, make_tenant):
    from app.tenants import keys

    app.config.update(RATE_LIMIT_CAPACITY=3, RATE_LIMIT_REFILL_PER_MINUTE=1)
    first, second = make_tenant("pro"), make_tenant("pro")
    for _ in range(3):
        client.get("/v1/tenant/usage", headers=first.headers)
    assert client.get("/v1/tenant/usage", headers=first.headers).status_code == 429
    assert client.get("/v1/tenant/usage", headers=second.headers).status_code == 200
    with app.app_context(), unit_of_work():
        new_key, _ = keys.rotate(first.tenant_id, operator=True)
    rotated = client.get("/v1/tenant/usage", headers={"X-Service-Key": new_key})
    assert_envelope(rotated, 429, "rate limit exceeded")


def test_the_monthly_limit_keeps_its_own_text(app, client, make_tenant):
    from app.clock import billing_period
    from app.tenants.models import MonthlyUsage

    tenant = make_tenant("free")
    with app.app_context():
        db.session.add(MonthlyUsage(tenant_id=tenant.tenant_id, period=billing_period(),
                                    usage_count=1000))
        db.session.commit()
    response = client.post("/v1/intent/generate", headers=tenant.headers,
                           json={"user_token": "quota-user-token"})
    assert_envelope(response, 429, "monthly verification limit reached")
    assert "X-RateLimit-Remaining" in response.headers


def test_failed_authentication_is_limited_per_address(app, client, tenant):
    app.config["AUTH_FAILURE_LIMIT"] = "5 per minute"
    attacker = {"REMOTE_ADDR": "198.51.100.7"}
    statuses = [client.get("/v1/tenant/usage", headers=BAD_KEY, environ_base=attacker).status_code
                for _ in range(7)]
    assert statuses == [401] * 5 + [429] * 2
    blocked = client.get("/v1/tenant/usage", headers=BAD_KEY, environ_base=attacker)
    body = assert_envelope(blocked, 429, "rate limit exceeded")
    assert body["retry_after"] >= 1 and blocked.headers["X-RateLimit-Remaining"] == "0"
    # Only failures are limited: a valid key from that address still works.
    assert client.get("/v1/tenant/usage", headers=tenant.headers,
                      environ_base=attacker).status_code == 200
    other = client.get("/v1/tenant/usage", headers=BAD_KEY, environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert_envelope(other, 401, "Invalid or inactive API key")
    # successful requests do not spend the failure allowance
    good = {"REMOTE_ADDR": "192.0.2.1"}
    for _ in range(8):
        assert client.get("/v1/tenant/usage", headers=tenant.headers, environ_base=good).status_code == 200


def test_forwarded_for_is_ignored_without_trusted_proxies(app, client):
    app.config["AUTH_FAILURE_LIMIT"] = "2 per minute"
    for spoof in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        response = client.get("/v1/tenant/usage", headers={**BAD_KEY, "X-Forwarded-For": spoof})
    assert response.status_code == 429


def test_trusted_proxy_hops_give_the_client_address(settings, migrated):
    settings.update(TRUSTED_PROXY_HOPS=1, AUTH_FAILURE_LIMIT="2 per minute")
    app = create_app(settings)
    client = app.test_client()
    statuses = [client.get("/v1/tenant/usage", headers={**BAD_KEY, "X-Forwarded-For": address}
                           ).status_code for address in ("10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2")]
    assert statuses == [401, 401, 429, 401]


def test_an_ipv6_client_is_counted_by_its_64_not_each_address(settings, migrated, tenant):
    """A host holds a whole /64: one allowance for it, not 2^64. Its audit entries keep the
    full address; another /64, and an IPv4 address mapped into IPv6, count apart."""
    settings.update(TRUSTED_PROXY_HOPS=1, AUTH_FAILURE_LIMIT="2 per minute")
    client = create_app(settings).test_client()

    def attempt(address, headers=BAD_KEY):
        return client.get("/v1/tenant/usage", headers={**headers, "X-Forwarded-For": address})

    statuses = [attempt(f"2001:db8:1:2::{host:x}").status_code for host in range(1, 5)]
    assert statuses == [401, 401, 429, 429]
    assert attempt("2001:db8:1:3::1").status_code == 401
    assert [attempt("::ffff:198.51.100.7").status_code for _ in range(3)] == [401, 401, 429]
    assert attempt("198.51.100.7").status_code == 429  # the same client either way
    changed = client.post("/v1/tenant/signing-secret/rotate", json={},
                          headers={**tenant.headers, "X-Forwarded-For": "2001:db8:1:2::99"})
    assert changed.status_code == 200
    entries = client.get("/v1/tenant/audit-log", headers=tenant.headers).get_json()["entries"]
    assert entries[0]["address"] == "2001:db8:1:2::99"


def test_an_address_that_is_no_address_is_unknown(settings, migrated, tenant):
    """A proxy passing X-Forwarded-For on unchecked: the text names neither a bucket of its own
    nor an audit entry's address (its column holds 64 characters)."""
    settings.update(TRUSTED_PROXY_HOPS=1, AUTH_FAILURE_LIMIT="2 per minute")
    client = create_app(settings).test_client()
    statuses = [client.get("/v1/tenant/usage", headers={**BAD_KEY, "X-Forwarded-For": forged}
                           ).status_code for forged in ("a" * 100, "b" * 100, "c" * 100)]
    assert statuses == [401, 401, 429]  # one shared bucket, not one per invented text
    changed = client.post("/v1/tenant/signing-secret/rotate", json={},
                          headers={**tenant.headers, "X-Forwarded-For": "a" * 100})
    assert changed.status_code == 200
    entries = client.get("/v1/tenant/audit-log", headers=tenant.headers).get_json()["entries"]
    assert entries[0]["action"] == "signing_secret.rotated" and entries[0]["address"] == "unknown"


def test_cors_for_an_allowed_origin_only(settings, migrated, tenant):
    settings["CORS_ORIGINS"] = ["https://app.example.com"]
    client = create_app(settings).test_client()
    preflight = client.options("/v1/intent/generate", headers={
        "Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "X-Service-Key, Content-Type, Idempotency-Key"})
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
    assert "x-service-key" in allowed and "idempotency-key" in allowed
    assert preflight.headers["X-Request-Id"]
    actual = client.get("/v1/tenant/usage", headers={**tenant.headers, "Origin": "https://app.example.com"})
    exposed = actual.headers["Access-Control-Expose-Headers"]
    assert "X-Request-Id" in exposed and "X-RateLimit-Remaining" in exposed and "Retry-After" in exposed
    for origin in ("https://evil.example.com", "http://app.example.com"):
        other = client.options("/v1/intent/generate", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert "Access-Control-Allow-Origin" not in other.headers


def test_no_cors_by_default(client):
    preflight = client.options("/v1/intent/generate", headers={
        "Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"})
    assert "Access-Control-Allow-Origin" not in preflight.headers


@pytest.fixture
def disposable_redis():
    """A Redis of our own on a free port, so the test can stop it without touching others."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the Redis outage test needs one to stop")
    port = free_port()
    process = start_redis(port)
    yield f"redis://127.0.0.1:{port}/0", process
    process.kill()
    process.wait()


def start_redis(port):
    """A redis-server on `port` that keeps nothing on disk, once it answers."""
    import redis

    process = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind",
                                "127.0.0.1", "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            time.sleep(0.05)
    process.kill()
    raise AssertionError(f"no Redis answered on port {port}")


def _app_on(settings, redis_url, **overrides):
    settings.update(REDIS_URL=redis_url, REDIS_SOCKET_TIMEOUT=0.3, **overrides)
    return create_app(settings)


def test_redis_down_fails_closed_without_hanging(settings, migrated, make_tenant, disposable_redis):
    url, process = disposable_redis
    app = _app_on(settings, url)
    client = app.test_client()
    with app.app_context():
        tenant = make_tenant("pro")
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200
    process.kill()
    process.wait()
    asked_at = time.time()
    started = time.monotonic()
    response = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert time.monotonic() - started < 2
    assert_envelope(response, 503, "rate limit store unavailable")
    health = client.get("/health")
    assert health.status_code == 503 and health.headers["Retry-After"] == "1"
    assert health.get_json()["checks"] == {"database": "ok", "rate_limit_store": "unavailable"}
    # Every /v1/* answer still carries X-RateLimit-*: the limit, no token to count on, and a
    # reset after the Retry-After second.
    refused_key = client.get("/v1/tenant/usage", headers={"X-Service-Key": "key_live_" + "0" * 48})
    answers = [(response, 100), (client.get("/v1/nowhere"), 20), (refused_key, 20),
               (client.options("/v1/intent/verify"), 20)]
    for answer, limit in answers:
        assert answer.headers["X-RateLimit-Limit"] == str(limit)
        assert answer.headers["X-RateLimit-Remaining"] == "0"
        # Not before the Retry-After second of any of them, and within a second after it.
        reset = int(answer.headers["X-RateLimit-Reset"])
        assert asked_at + 1 <= reset < time.time() + 2
    assert [answer.status_code for answer, _ in answers] == [503, 404, 401, 200]


def test_redis_down_can_fail_open_for_a_bounded_time(settings, migrated, make_tenant,
                                                     disposable_redis):
    url, process = disposable_redis
    app = _app_on(settings, url, RATE_LIMIT_STORE_FAILURE="open", RATE_LIMIT_FAIL_OPEN_SECONDS=1)
    client = app.test_client()
    with app.app_context():
        tenant = make_tenant("pro")
    process.kill()
    process.wait()
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200
    time.sleep(1.2)
    assert_envelope(client.get("/v1/tenant/usage", headers=tenant.headers), 503,
                    "rate limit store unavailable")


def test_a_frozen_redis_answers_each_thread_within_one_timeout(settings, migrated, make_tenant,
                                                               disposable_redis):
    url, process = disposable_redis
    app = _app_on(settings, url)  # REDIS_SOCKET_TIMEOUT 0.3 s
    with app.app_context():
        tenant = make_tenant("pro")
    assert app.test_client().get("/v1/tenant/usage", headers=tenant.headers).status_code == 200

    def ask(_):
        started = time.monotonic()
        response = app.test_client().get("/v1/tenant/usage", headers=tenant.headers)
        return response.status_code, time.monotonic() - started

    process.send_signal(signal.SIGSTOP)  # frozen: connections open, nothing answers
    try:
        with ThreadPoolExecutor(8) as pool:  # a gthread worker's threads
            answers = list(pool.map(ask, range(8)))
    finally:
        process.send_signal(signal.SIGCONT)
    assert [status for status, _ in answers] == [503] * 8
    # Each thread waits for its own connection's timeout, not its turn behind the other
    # threads' timeouts (8 x 0.3 s on one connection shared by the worker).
    assert max(elapsed for _, elapsed in answers) < 1.5


def test_cors_answers_vary_by_origin_whatever_the_origin(settings, migrated, tenant):
    settings["CORS_ORIGINS"] = ["https://app.example.com"]
    client = create_app(settings).test_client()
    # A cache must not serve the answer for one Origin (or none) to another.
    for origin in ("https://app.example.com", "https://evil.example.com", None):
        headers = {**tenant.headers, **({"Origin": origin} if origin else {})}
        response = client.get("/v1/tenant/usage", headers=headers)
        assert "Origin" in response.headers.get("Vary", ""), (origin, response.headers)
