"""Tenant authentication, usage, key rotation, plans and deactivation over HTTP."""
import hashlib

import pytest
import time_machine
from sqlalchemy import select

from app.extensions import db
from app.tenants import service
from app.tenants.models import ApiKey
from app.sql import unit_of_work
from tests.support import assert_envelope, set_usage

ACCOUNT_ENDPOINTS = [("get", "/v1/tenant/usage"), ("post", "/v1/tenant/rotate-key")]


@pytest.mark.parametrize("method, path", ACCOUNT_ENDPOINTS)
def test_missing_key_is_401_with_the_account_text(client, method, path):
    response = getattr(client, method)(path)
    assert_envelope(response, 401, "Missing X-Service-Key header")


@pytest.mark.parametrize("method, path", ACCOUNT_ENDPOINTS)
# An empty header is present: an invalid key, not a missing one.
@pytest.mark.parametrize("key", ["key_live_" + "0" * 48, "not-a-key", "key_live_" + "A" * 48, ""])
def test_unknown_key_is_401_with_the_account_text(client, method, path, key):
    response = getattr(client, method)(path, headers={"X-Service-Key": key})
    assert_envelope(response, 401, "Invalid or inactive API key")


def test_usage_reports_the_plan_and_counts(client, make_tenant):
    tenant = make_tenant("starter")
    set_usage(client.application, tenant.tenant_id, 1234, period=_period())
    response = client.get("/v1/tenant/usage", headers=tenant.headers)
    assert response.status_code == 200
    assert response.get_json() == {
        "email": tenant.email, "plan": "starter", "usage_count": 1234,
        "rate_limit": 50_000, "remaining": 50_000 - 1234,
    }


@pytest.mark.parametrize("plan, limit", [("free", 1000), ("starter", 50_000), ("pro", 500_000)])
def test_usage_limits_follow_the_plan(client, make_tenant, plan, limit):
    tenant = make_tenant(plan)
    body = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert (body["usage_count"], body["rate_limit"], body["remaining"]) == (0, limit, limit)


def test_enterprise_usage_is_unlimited(client, make_tenant):
    tenant = make_tenant("enterprise")
    set_usage(client.application, tenant.tenant_id, 7, period=_period())
    body = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert body["usage_count"] == 7
    assert body["rate_limit"] is None and body["remaining"] is None


def test_usage_starts_at_zero_when_the_month_turns(client, make_tenant):
    with time_machine.travel("2026-11-30T23:59:00Z", tick=False):
        tenant = make_tenant("free")
        set_usage(client.application, tenant.tenant_id, 900, period="2026-11")
        assert client.get("/v1/tenant/usage", headers=tenant.headers).get_json()["usage_count"] == 900
    with time_machine.travel("2026-12-01T00:00:30Z", tick=False):
        body = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
        assert (body["usage_count"], body["remaining"]) == (0, 1000)


def test_rotation_invalidates_the_old_key_everywhere(client, tenant):
    response = client.post("/v1/tenant/rotate-key", headers=tenant.headers)
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"new_key", "message"}
    assert body["new_key"].startswith("key_live_") and len(body["new_key"]) == 57
    assert "invalid" in body["message"]
    for method, path in ACCOUNT_ENDPOINTS:
        old = getattr(client, method)(path, headers=tenant.headers)
        assert_envelope(old, 401, "Invalid or inactive API key")
    assert client.get("/v1/tenant/usage", headers={"X-Service-Key": body["new_key"]}).status_code == 200


def test_rotation_stores_only_a_digest(client, tenant):
    new_key = client.post("/v1/tenant/rotate-key", headers=tenant.headers).get_json()["new_key"]
    with client.application.app_context():
        rows = db.session.execute(select(ApiKey).where(ApiKey.tenant_id == tenant.tenant_id)
                                  ).scalars().all()
        stored = " ".join(str(value) for row in rows for value in row.__dict__.values())
    assert new_key not in stored and tenant.signing_secret not in stored
    assert {row.prefix for row in rows if row.revoked_at is None} == {new_key[:15]}
    assert {row.key_digest for row in rows if row.revoked_at is None} == {
        hashlib.sha256(new_key.encode()).hexdigest()}


def test_rotation_accepts_an_empty_json_body_but_not_garbage(client, tenant):
    response = client.post("/v1/tenant/rotate-key", headers=tenant.headers, data="[1,",
                           content_type="application/json")
    assert_envelope(response, 400, "request body is not valid JSON")


@pytest.mark.parametrize("body", [{"x": 1}, {"new_key": "key_live_" + "0" * 48}])
def test_rotation_refuses_any_field(client, tenant, body):
    response = client.post("/v1/tenant/rotate-key", headers=tenant.headers, json=body)
    assert_envelope(response, 400, f"unknown field: {next(iter(body))}")
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200


@pytest.mark.parametrize("request_body", [{"json": {}}, {"data": b""}])
def test_rotation_takes_an_empty_body_or_an_empty_object(client, tenant, request_body):
    response = client.post("/v1/tenant/rotate-key", headers=tenant.headers, **request_body)
    assert response.status_code == 200 and response.get_json()["new_key"].startswith("key_live_")


def test_deactivated_tenant_gets_401_and_reactivation_restores(client, tenant):
    with client.application.app_context(), unit_of_work():
        service.update_tenant(tenant.tenant_id, active=False)
    assert_envelope(client.get("/v1/tenant/usage", headers=tenant.headers), 401,
                    "Invalid or inactive API key")
    with client.application.app_context(), unit_of_work():
        service.update_tenant(tenant.tenant_id, active=True)
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200


def test_plan_change_takes_effect_at_once(client, make_tenant):
    tenant = make_tenant("free")
    with client.application.app_context(), unit_of_work():
        service.update_tenant(tenant.email, plan="pro")
    assert client.get("/v1/tenant/usage", headers=tenant.headers).get_json()["rate_limit"] == 500_000


def test_remaining_is_the_limit_less_the_count_after_a_downgrade(client, make_tenant):
    # SPEC.md: remaining equals rate_limit - usage_count, with no floor.
    tenant = make_tenant("starter")
    set_usage(client.application, tenant.tenant_id, 1500, period=_period())
    with client.application.app_context(), unit_of_work():
        service.update_tenant(tenant.email, plan="free")
    body = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert (body["usage_count"], body["rate_limit"], body["remaining"]) == (1500, 1000, -500)


def test_admin_key_on_a_tenant_endpoint_is_403(client, runner):
    admin_key = _admin_key(runner)
    response = client.get("/v1/tenant/usage", headers={"X-Service-Key": admin_key})
    assert_envelope(response, 403, "this endpoint requires a tenant key")


def test_multi_tenancy_off_answers_503(settings, migrated):
    from app import create_app

    settings["MULTI_TENANCY"] = False
    app = create_app(settings)
    with app.app_context():
        with unit_of_work():
            credentials = service.create_tenant("solo@example.com", "pro")
        client = app.test_client()
        for method, path in ACCOUNT_ENDPOINTS:
            response = getattr(client, method)(path, headers={"X-Service-Key": credentials.api_key})
            assert_envelope(response, 503, "Multi-tenancy not configured")
        db.session.delete(credentials.tenant)
        db.session.commit()


def _admin_key(runner):
    import json

    result = runner.invoke(args=["admin-keys", "create", "--name", "ops", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["api_key"]


def _period():
    from app.clock import billing_period

    return billing_period()
