"""flask tenants ... and flask admin-keys ... through the CLI runner."""
import json

import pytest

from app.clock import billing_period
from app.extensions import db
from app.tenants.models import MonthlyUsage


def _invoke(runner, *args):
    return runner.invoke(args=list(args))


def _create(runner, email="cli@example.com", plan="starter"):
    result = _invoke(runner, "tenants", "create", "--email", email, "--plan", plan, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_create_prints_the_credentials_once_as_json(runner, client):
    created = _create(runner)
    assert set(created) == {"tenant_id", "email", "plan", "api_key", "signing_secret"}
    assert created["email"] == "cli@example.com" and created["plan"] == "starter"
    assert created["signing_secret"].startswith("sig_live_") and len(created["signing_secret"]) == 73
    usage = client.get("/v1/tenant/usage", headers={"X-Service-Key": created["api_key"]})
    assert usage.get_json()["plan"] == "starter"
    shown = _invoke(runner, "tenants", "show", str(created["tenant_id"]))
    assert created["api_key"] not in shown.output and created["signing_secret"] not in shown.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--email", "not-an-email"], "email is not a valid email address"),
        (["--email", "x@example.com", "--plan", "gold"], "Invalid value for '--plan'"),
    ],
)
def test_create_rejects_bad_input_with_one_line(runner, args, message):
    result = _invoke(runner, "tenants", "create", *args)
    assert result.exit_code != 0
    assert message in result.output


def test_duplicate_email_is_refused(runner):
    _create(runner, email="dup@example.com")
    result = _invoke(runner, "tenants", "create", "--email", "DUP@example.com")
    assert result.exit_code == 1
    assert "Error: a tenant with this email already exists" in result.output


def test_list_show_set_plan_and_usage(runner):
    created = _create(runner, plan="free")
    assert "cli@example.com\tfree\tactive" in _invoke(runner, "tenants", "list").output
    result = _invoke(runner, "tenants", "set-plan", "cli@example.com", "pro")
    assert result.exit_code == 0 and json.loads(result.stdout)["plan"] == "pro"
    db.session.add(MonthlyUsage(tenant_id=created["tenant_id"], period=billing_period(),
                                usage_count=5))
    db.session.commit()
    usage = json.loads(_invoke(runner, "tenants", "usage", str(created["tenant_id"])).stdout)
    assert usage == {"email": "cli@example.com", "plan": "pro", "usage_count": 5,
                     "rate_limit": 500_000, "remaining": 499_995}


def test_unknown_tenant_is_a_one_line_error(runner):
    result = _invoke(runner, "tenants", "show", "nobody@example.com")
    assert result.exit_code == 1 and result.output.strip() == "Error: tenant not found"


def test_deactivate_activate_and_rotate_key(runner, client):
    created = _create(runner)
    headers = {"X-Service-Key": created["api_key"]}
    assert _invoke(runner, "tenants", "deactivate", "cli@example.com").exit_code == 0
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 401
    assert _invoke(runner, "tenants", "activate", "cli@example.com").exit_code == 0
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 200
    rotated = _invoke(runner, "tenants", "rotate-key", "cli@example.com")
    new_key = rotated.stdout.strip()
    assert new_key.startswith("key_live_") and new_key != created["api_key"]
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 401
    assert client.get("/v1/tenant/usage", headers={"X-Service-Key": new_key}).status_code == 200


def test_rotate_signing_secret_keeps_the_previous_one_for_the_grace(runner):
    from app.tenants.service import find_tenant

    created = _create(runner)
    result = _invoke(runner, "tenants", "rotate-signing-secret", "cli@example.com", "--grace", "300")
    new_secret = result.stdout.strip()
    assert new_secret.startswith("sig_live_") and new_secret != created["signing_secret"]
    tenant = find_tenant("cli@example.com")
    assert tenant.previous_signing_secret_sealed is not None
    assert tenant.previous_signing_secret_expires_at is not None
    assert created["signing_secret"] not in tenant.previous_signing_secret_sealed


def test_admin_keys_create_list_revoke(runner, client):
    result = _invoke(runner, "admin-keys", "create", "--name", "billing", "--json")
    issued = json.loads(result.stdout)
    headers = {"X-Service-Key": issued["api_key"]}
    assert client.get("/v1/admin/tenants", headers=headers).status_code == 200
    assert "billing\tactive" in _invoke(runner, "admin-keys", "list").output
    again = _invoke(runner, "admin-keys", "create", "--name", "billing")
    assert again.exit_code == 1 and "already exists" in again.output
    assert _invoke(runner, "admin-keys", "revoke", "billing").exit_code == 0
    response = client.get("/v1/admin/tenants", headers=headers)
    assert response.status_code == 401
    assert response.get_json()["error"] == "Invalid or inactive API key"
