"""Production behaviour in process: HTTPS only, HSTS, metrics."""
import re

import pytest

from app import create_app
from tests.support import assert_envelope, scale_response


def _production_app(settings, **overrides):
    settings.update(DEPLOYMENT_MODE="production", **overrides)
    return create_app(settings)


def test_plain_http_is_refused_in_production(settings, migrated, tenant):
    client = _production_app(settings).test_client()
    response = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert_envelope(response, 403, "HTTPS is required: this service does not accept plain HTTP")
    assert response.headers["Strict-Transport-Security"].startswith("max-age=")
    assert client.get("/health").status_code == 200  # load balancers probe over HTTP
    secure = client.get("/v1/tenant/usage", headers=tenant.headers, base_url="https://localhost")
    assert secure.status_code == 200
    assert "includeSubDomains" in secure.headers["Strict-Transport-Security"]


def test_tls_at_a_trusted_proxy_counts_and_a_spoofed_header_does_not(settings, migrated, tenant):
    proxied = _production_app(dict(settings), TRUSTED_PROXY_HOPS=1).test_client()
    forwarded = {**tenant.headers, "X-Forwarded-Proto": "https", "X-Forwarded-For": "192.0.2.10"}
    assert proxied.get("/v1/tenant/usage", headers=forwarded).status_code == 200
    direct = _production_app(dict(settings)).test_client()
    assert direct.get("/v1/tenant/usage", headers=forwarded).status_code == 403


def test_local_mode_allows_plain_http_without_hsts(client, tenant):
    response = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert response.status_code == 200 and "Strict-Transport-Security" not in response.headers


def _sample(text, name, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_are_off_by_default(client):
    assert_envelope(client.get("/metrics"), 404, "not found")


@pytest.fixture
def metrics_enabled(settings):
    settings["METRICS_ENABLED"] = True


def test_metrics_count_verdicts_requests_and_context_failures(metrics_enabled, app, client, tenant,
                                                              httpserver):
    before = client.get("/metrics").get_data(as_text=True)
    intent_hash = client.post("/v1/intent/generate", headers=tenant.headers,
                              json={"user_token": "metrics-user-token"}).get_json()["intent_hash"]
    response = scale_response(tenant.signing_secret, intent_hash)
    for _ in range(2):  # cleared, then ReplayedIntent
        client.post("/v1/intent/verify", headers=tenant.headers,
                    json={"original_intent_hash": intent_hash, "response": response})
    httpserver.expect_request("/ctx").respond_with_data("down", status=503)
    app.config["CONTEXT_STORE_URL"] = httpserver.url_for("/ctx")
    client.post("/v1/intent/generate", headers=tenant.headers, json={"user_token": "metrics-user-token"})
    after = client.get("/metrics").get_data(as_text=True)

    def delta(name, **labels):
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert delta("intentgate_verifications_total", outcome="cleared") == 1
    assert delta("intentgate_verifications_total", outcome="ReplayedIntent") == 1
    assert delta("intentgate_context_store_failures_total", failure="status 503") == 1
    assert delta("intentgate_http_requests_total", endpoint="/v1/intent/verify", status="200") == 2
    assert delta("intentgate_http_requests_total", endpoint="/v1/intent/generate", status="502") == 1
    assert re.search(r'intentgate_http_request_duration_seconds_count\{endpoint="/v1/intent/verify"', after)
    assert tenant.api_key not in after
    # One charset: CONTENT_TYPE_LATEST carries it already.
    assert client.get("/metrics").headers["Content-Type"] == \
        "text/plain; version=1.0.0; charset=utf-8"


def test_a_method_no_route_knows_is_counted_as_other(metrics_enabled, client):
    """Each label value is a series on every scrape: a client's made-up method tokens must not
    add series without bound."""
    for token in ("XQWERTY", "NGX_B", "BREW"):
        client.open("/v1/intent/generate", method=token)
    scraped = client.get("/metrics").get_data(as_text=True)
    assert "XQWERTY" not in scraped and "BREW" not in scraped
    # A 405 is answered by routing: no route pattern either.
    assert _sample(scraped, "intentgate_http_requests_total", endpoint="unmatched",
                   method="other", status="405") == 3
