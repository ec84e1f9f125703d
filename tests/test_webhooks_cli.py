"""flask webhooks ...: an operator manages any tenant's endpoints and usage alerts through the
same service as the HTTP API."""
import json

import pytest

from tests.receivers import Receiver


@pytest.fixture
def settings(settings):
    settings.update(WEBHOOK_ALLOW_PRIVATE_ADDRESSES=True)
    return settings


def _run(runner, *args):
    result = runner.invoke(args=["webhooks", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_an_operator_manages_a_tenants_webhooks(app, runner, tenant, leak_watch):
    with Receiver() as receiver:
        created = json.loads(_run(runner, "create", tenant.email, receiver.url,
                                  "--event", "usage.threshold"))
        leak_watch.add(created["secret"])
        assert created["events"] == ["usage.threshold"]
        (listed,) = json.loads(_run(runner, "list", str(tenant.tenant_id)))
        assert listed["id"] == created["id"] and "secret" not in listed
        secret = _run(runner, "rotate-secret", tenant.email, created["id"], "--grace", "60")
        leak_watch.add(secret.strip())
        assert secret.startswith("whsec_")
        queued = json.loads(_run(runner, "test", tenant.email, created["id"]))
        assert "1 attempts made" in _run(runner, "deliver", "--once")
        (request,) = receiver.wait_for(1)
    assert request["headers"]["webhook-id"] == queued["event_id"]
    (attempt,) = json.loads(_run(runner, "deliveries", tenant.email, created["id"]))
    assert attempt["delivered"] and attempt["event_id"] == queued["event_id"]
    assert json.loads(_run(runner, "usage-alerts", tenant.email)) == {"thresholds": [80, 100]}
    assert json.loads(_run(runner, "usage-alerts", tenant.email, "50", "90")) == {
        "thresholds": [50, 90]}
    assert "deleted" in _run(runner, "delete", tenant.email, created["id"])
    refused = runner.invoke(args=["webhooks", "delete", tenant.email, created["id"]])
    assert refused.exit_code == 1 and "webhook not found" in refused.output
    refused = runner.invoke(args=["webhooks", "usage-alerts", tenant.email, "0"])
    assert refused.exit_code == 1 and "between 1 and 100" in refused.output


def test_deliver_once_also_raises_the_key_expiry_notices_due(app, runner, tenant, leak_watch):
    """--once is one pass of the worker's loop, for a timer: the sweep of expiring keys too."""
    with Receiver() as receiver:
        created = json.loads(_run(runner, "create", tenant.email, receiver.url,
                                  "--event", "api_key.expiring"))
        leak_watch.add(created["secret"])
        key = runner.invoke(args=["tenants", "keys", "add", str(tenant.tenant_id), "--name",
                                  "brief", "--expires-in", "3600"])
        assert key.exit_code == 0, key.output
        assert "1 attempts made" in _run(runner, "deliver", "--once")
        (request,) = receiver.wait_for(1)
    assert json.loads(request["body"])["type"] == "api_key.expiring"
