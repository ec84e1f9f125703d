"""The limiter as Flask-Limiter: limits declared per blueprint, the token bucket as a `limits`
strategy over any storage, and the store's circuit breaker."""
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import flask
import flask_limiter
import pytest
from flask import request
from limits import parse
from limits.storage import storage_from_string
from limits.strategies import STRATEGIES

from app import create_app
from app.auth import authenticate
from app.extensions import limiter
from app.openapi import Blueprint
from app.traffic import limits
from app.traffic.limiter import Limiter
from app.traffic.storage import DatabaseStorage
from app.traffic.strategy import BREAKER_SECONDS, TokenBucketRateLimiter
from tests.support import assert_envelope
from tests.test_traffic import (BAD_KEY, _app_on, disposable_redis,  # noqa: F401 - a fixture
                                start_redis)


def test_the_token_bucket_is_a_registered_strategy_and_the_database_a_storage():
    assert STRATEGIES["token-bucket"] is TokenBucketRateLimiter
    assert isinstance(storage_from_string("intentgate+database://"), DatabaseStorage)


def test_a_new_view_on_a_v1_blueprint_is_limited_without_a_word_in_it(settings, migrated,
                                                                         make_tenant):
    extra = Blueprint("extra", __name__, url_prefix="/v1/extra")
    limits.declare(extra)

    @extra.get("/ping")
    @authenticate(scope=None)
    def ping():  # nothing about rate limits here
        return {"pong": True}

    app = create_app(settings)
    app.register_blueprint(extra)
    app.config.update(RATE_LIMIT_CAPACITY=2, RATE_LIMIT_REFILL_PER_MINUTE=1,
                      AUTH_FAILURE_LIMIT="1 per minute")
    client = app.test_client()
    tenant = make_tenant("pro")
    statuses = [client.get("/v1/extra/ping", headers=tenant.headers).status_code
                for _ in range(3)]
    assert statuses == [200, 200, 429]
    # It is the tenant's one bucket, the same its other endpoints spend from.
    assert_envelope(client.get("/v1/tenant/usage", headers=tenant.headers), 429,
                    "rate limit exceeded")
    failures = [client.get("/v1/extra/ping", headers=BAD_KEY).status_code for _ in range(2)]
    assert failures == [401, 429]


def test_the_failure_limit_of_a_long_ipv6_address(app, client):
    # The bucket's key (address and limit) is longer than the database column: still one bucket.
    app.config["AUTH_FAILURE_LIMIT"] = "3 per minute"
    address = {"REMOTE_ADDR": "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"}
    statuses = [client.get("/v1/tenant/usage", headers=BAD_KEY, environ_base=address).status_code
                for _ in range(4)]
    assert statuses == [401, 401, 401, 429]
    # Another /64 (one address of the same /64 is the same client: test_traffic.py).
    other = client.get("/v1/tenant/usage", headers=BAD_KEY,
                       environ_base={"REMOTE_ADDR": "2001:db8:ffff:fffe:ffff:ffff:ffff:ffff"})
    assert other.status_code == 401


def test_headers_read_after_a_hit_cost_no_second_call(app, client, tenant, monkeypatch):
    peeks = []
    monkeypatch.setattr(limiter.limiter.tokens, "peek_tokens",
                        lambda *args: peeks.append(args) or 0.0)
    response = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert response.status_code == 200 and response.headers["X-RateLimit-Remaining"] == "99"
    assert peeks == []  # the headers came from the hit's own answer


def test_a_frozen_store_is_asked_once_then_by_no_request_until_it_answers(
        settings, migrated, make_tenant, disposable_redis, monkeypatch):
    """The breaker: after a timeout the worker answers by the failure policy without asking the
    store, for as long as the store does not answer (a thread of the worker asks it once a
    second); /health says the store is failing meanwhile; once it answers, requests use it."""
    url, process = disposable_redis
    app = _app_on(settings, url)  # REDIS_SOCKET_TIMEOUT 0.3 s
    client = app.test_client()
    tenant = make_tenant("pro")
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200
    tokens = limiter.limiter.tokens
    asked = []
    take = tokens.take_token
    monkeypatch.setattr(tokens, "take_token", lambda *args: asked.append(args) or take(*args))

    process.send_signal(signal.SIGSTOP)
    try:
        first = client.get("/v1/tenant/usage", headers=tenant.headers)
        opened = time.monotonic()
        assert_envelope(first, 503, "rate limit store unavailable")
        answers = []
        # Past two of the breaker's seconds: the store is asked again in the background only.
        while time.monotonic() - opened < 2.5 * BREAKER_SECONDS:
            started = time.monotonic()
            response = client.get("/v1/tenant/usage", headers=tenant.headers)
            answers.append((response.status_code, time.monotonic() - started))
        health = client.get("/health")
        asked_while_frozen = len(asked)
    finally:
        process.send_signal(signal.SIGCONT)
    # The mechanism: one call reached the store (the one that timed out), none after it.
    assert asked_while_frozen == 1 and len(answers) >= 3
    assert {status for status, _ in answers} == {503}
    assert health.status_code == 503
    assert health.get_json()["checks"]["rate_limit_store"] == "unavailable"
    # Within 50 ms on a quiet machine (bench it there); asserted here only as what no load
    # can blur: the typical answer waited for no store timeout (0.3 s). The guarantee itself
    # is the count above: no store call from a request while the breaker is open.
    assert sorted(seconds for _, seconds in answers)[len(answers) // 2] < 0.25
    # The store answers again: the worker's thread finds it within a second or two.
    deadline = time.monotonic() + 10
    while client.get("/v1/tenant/usage", headers=tenant.headers).status_code != 200:
        assert time.monotonic() < deadline, "the breaker never closed"
        time.sleep(0.05)
    assert client.get("/health").status_code == 200


def test_a_restarted_redis_is_found_again_by_each_thread(settings, migrated, make_tenant,
                                                        disposable_redis):
    """Each thread keeps a connection of its own: after Redis restarts (every socket dead, its
    buckets gone) the threads that held one reconnect, with no restart of the app."""
    url, process = disposable_redis
    app = _app_on(settings, url)
    tenant = make_tenant("pro")

    def remaining(_=None):
        response = app.test_client().get("/v1/tenant/usage", headers=tenant.headers)
        return response.status_code, response.headers["X-RateLimit-Remaining"]

    spent = [(200, "96"), (200, "97"), (200, "98"), (200, "99")]
    with ThreadPoolExecutor(3) as pool:  # the same threads before and after the restart
        assert sorted([remaining(), *pool.map(remaining, range(3))]) == spent
        process.kill()
        process.wait()
        restarted = start_redis(int(url.rsplit(":", 1)[1].split("/")[0]))
        try:
            # Had a request seen the outage, the breaker's thread has asked again by now.
            time.sleep(2 * BREAKER_SECONDS)
            answers = [remaining(), *pool.map(remaining, range(3))]
        finally:
            restarted.kill()
            restarted.wait()
    # A fresh Redis holds a fresh bucket: four of its tokens spent.
    assert sorted(answers) == spent


def test_the_breaker_applies_the_open_policy_too(settings, migrated, make_tenant, disposable_redis):
    url, process = disposable_redis
    app = _app_on(settings, url, RATE_LIMIT_STORE_FAILURE="open")
    client = app.test_client()
    tenant = make_tenant("pro")
    process.send_signal(signal.SIGSTOP)
    try:
        statuses = [client.get("/v1/tenant/usage", headers=tenant.headers).status_code
                    for _ in range(5)]
        assert limiter.limiter.broken
    finally:
        process.send_signal(signal.SIGCONT)
    assert statuses == [200] * 5


@pytest.mark.parametrize("capacity, refill", [
    (3, 1), (100, 100), (10, 1000), (1, 100), (5, 200), (100, 4000), (100, 7)])
def test_a_bucket_item_is_capacity_and_refill(app, capacity, refill):
    """Exactly the settings, also where no whole number of seconds spells the refill (10 a
    bucket refilling 1,000 a minute once ran at 600)."""
    with app.app_context():
        app.config.update(RATE_LIMIT_CAPACITY=capacity, RATE_LIMIT_REFILL_PER_MINUTE=refill)
        item = parse(limits.bucket_limit())
    assert item.amount == capacity
    assert item.amount / item.get_expiry() * 60 == pytest.approx(refill, rel=1e-6)


def test_a_refill_of_no_whole_seconds_limits_requests(app, client, make_tenant):
    tenant = make_tenant("pro")
    app.config.update(RATE_LIMIT_CAPACITY=2, RATE_LIMIT_REFILL_PER_MINUTE=7)
    answers = [client.get("/v1/tenant/usage", headers=tenant.headers) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert answers[0].headers["X-RateLimit-Limit"] == "2"
    assert answers[2].headers["Retry-After"] == "9"  # a token every 60/7 s


def test_each_endpoint_resolved_once_still_follows_the_settings(app, client, make_tenant):
    """The limit manager keeps each endpoint's limits between requests: a changed setting is
    still the limit of the very next request, not of a cached one."""
    tenant = make_tenant("pro")
    app.config.update(RATE_LIMIT_CAPACITY=1000)
    assert [client.get("/v1/tenant/usage", headers=tenant.headers).status_code
            for _ in range(3)] == [200] * 3
    assert client.get("/v1/tenant/usage", headers=tenant.headers).headers[
        "X-RateLimit-Limit"] == "1000"
    app.config.update(RATE_LIMIT_CAPACITY=2, RATE_LIMIT_REFILL_PER_MINUTE=1)
    answers = [client.get("/v1/tenant/usage", headers=tenant.headers) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert answers[0].headers["X-RateLimit-Limit"] == "2"


def test_a_key_of_the_wrong_kind_spends_its_own_bucket(app, client, make_tenant, admin_headers):
    """A tenant key on the admin API, or an admin key on the tenant API, is refused (403) as a
    request of its caller: from its bucket, to a 429 once it is spent, never without limit."""
    app.config.update(RATE_LIMIT_CAPACITY=2, RATE_LIMIT_REFILL_PER_MINUTE=1)
    tenant = make_tenant("pro")
    for path, headers, text in (
            ("/v1/admin/tenants", tenant.headers, "this endpoint requires an admin key"),
            ("/v1/tenant/keys", admin_headers, "this endpoint requires a tenant key")):
        answers = [client.get(path, headers=headers) for _ in range(3)]
        assert_envelope(answers[0], 403, text)
        assert answers[0].headers["X-RateLimit-Limit"] == "2"
        assert answers[0].headers["X-RateLimit-Remaining"] == "1"
        assert_envelope(answers[2], 429, "rate limit exceeded")


def _decisions(limiter_class, options):
    """What `limiter_class` decides for a sequence of requests to an app declaring limits as the
    service does (shared per blueprint, with exemptions, keys and an on_breach callback) and as
    it does not (a view's own limits beside them, per method and for one method, a key that
    comes out empty): each answer's status and body, with the limits the request spent from as
    the library records them for the headers."""
    app = flask.Flask(__name__)
    app.config.update(RATELIMIT_STORAGE_URI="memory://", RATELIMIT_STRATEGY="fixed-window")
    limiter_under_test = limiter_class(key_func=lambda: "everyone", auto_check=False, **options)
    pages = flask.Blueprint("pages", __name__)
    limiter_under_test.shared_limit("3 per minute", "caller",
                                    key_func=lambda: request.headers.get("Who", ""),
                                    exempt_when=lambda: "Anonymous" in request.headers)(pages)
    limiter_under_test.shared_limit(
        "2 per minute", "anonymous", key_func=lambda: "address",
        exempt_when=lambda: "Anonymous" not in request.headers,
        on_breach=lambda spent: flask.Response(f"breached {spent.limit}", status=429))(pages)

    @pages.before_request
    def check():
        limiter_under_test.check()
        spent = limiter_under_test.current_limit
        flask.g.spent = [str(spent.limit), spent.key, spent.breached] if spent else None
        flask.g.all_spent = [[str(one.limit), one.key] for one in limiter_under_test.current_limits]

    @pages.route("/page", methods=["GET", "POST"])
    def page():
        return {"spent": flask.g.spent, "all": flask.g.all_spent}

    @pages.route("/own", methods=["GET", "POST"])
    @limiter_under_test.limit("2 per minute", per_method=True, override_defaults=False,
                              key_func=lambda: request.headers["Who"])
    @limiter_under_test.limit("1 per minute", methods=["POST"], override_defaults=False,
                              key_func=lambda: request.headers["Who"])
    def own():
        return page()
    app.register_blueprint(pages)
    limiter_under_test.init_app(app)
    client = app.test_client()
    answers = []
    for path, method, headers in (
            [("/page", "GET", {"Who": "a"})] * 4 + [("/page", "GET", {"Who": ""})]
            + [("/page", "POST", {"Anonymous": "1"})] * 3 + [("/own", "GET", {"Who": "b"})] * 3
            + [("/own", "POST", {"Who": "b"})] * 2):
        answered = client.open(path, method=method, headers=headers)
        answers.append((answered.status_code,
                        answered.get_json() or answered.get_data(as_text=True)))
    return answers


@pytest.mark.parametrize("options", [{}, {"default_limits": ["4 per minute"]},
                                     {"meta_limits": ["2 per minute"]}])
def test_check_decides_as_flask_limiters_own_decision(options):
    """The Limiter's check() settles per endpoint what the library works out per request
    (app.traffic.limiter): its answers, the limits spent from and those recorded for the
    headers are the library's own, in order, breaches, exemptions and callbacks included; with a
    default or a meta limit, which it leaves to the library, too."""
    ours = _decisions(Limiter, options)
    assert ours == _decisions(flask_limiter.Limiter, options)
    statuses = [status for status, _ in ours]
    if "meta_limits" in options:
        # Two breaches within the minute: every request after them is refused.
        assert statuses == [200, 200, 200, 429, 200, 200, 200, 429] + [429] * 5
    else:
        assert statuses == [200, 200, 200, 429, 200, 200, 200, 429, 200, 200, 429, 200, 429]
        assert ours[4][1] == {"spent": None, "all": []}  # an empty key: the limit is skipped
        assert ours[7][1] == "breached 2 per 1 minute"  # the breached limit's own on_breach
        # A view's own limit is the one its headers follow (not the shared one); its limit for
        # POST alone is not spent by a GET.
        assert ours[8][1]["spent"][:2] == ["2 per 1 minute", "LIMITER/b/pages.own:GET/2/1/minute"]
        assert "1 per 1 minute" in ours[12][1]


def _default_limit_decisions(limiter_class, methods):
    """A default limit beside a view's own limit for POST only: a GET falls under the default
    (the view's limit does not apply to it), a POST does not."""
    app = flask.Flask(__name__)
    app.config.update(RATELIMIT_STORAGE_URI="memory://", RATELIMIT_STRATEGY="fixed-window")
    limiter_under_test = limiter_class(key_func=lambda: "everyone", auto_check=False,
                                       default_limits=["1 per minute"])

    @app.route("/page", methods=["GET", "POST"])
    @limiter_under_test.limit("5 per minute", methods=["POST"])
    def page():
        limiter_under_test.check()
        return {}

    limiter_under_test.init_app(app)
    client = app.test_client()
    return [client.open("/page", method=method).status_code for method in methods]


@pytest.mark.parametrize("methods", [["POST", "GET", "GET", "POST", "POST"],
                                     ["GET", "GET", "POST", "POST"]])
def test_whether_a_default_limit_applies_follows_each_request_s_method(methods):
    """The limit manager keeps what it resolved per endpoint; a default limit's applying
    depends on the method as well, and is not taken from an earlier request's."""
    expected = {"GET": [200, 429], "POST": [200] * 3}
    statuses = _default_limit_decisions(Limiter, methods)
    assert statuses == _default_limit_decisions(flask_limiter.Limiter, methods)
    for method, answers in expected.items():
        assert [status for asked, status in zip(methods, statuses)
                if asked == method] == answers[:methods.count(method)]
