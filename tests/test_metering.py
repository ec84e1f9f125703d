"""Monthly plan limits and idempotent retries of verify."""
import time_machine
from sqlalchemy import func, select

from app.extensions import db
from app.intents.models import IdempotencyRecord, Intent
from app.tenants import service as tenant_service
from app.tenants.models import MonthlyUsage
from app.sql import unit_of_work
from tests.support import assert_envelope, scale_response, set_usage

T0 = 1_800_000_000  # 2027-01-15


def _generate(client, credentials):
    return client.post("/v1/intent/generate", headers=credentials.headers,
                       json={"user_token": "meter-user-token"})


def _verify(client, credentials, intent_hash, response=None, headers=None):
    response = response or scale_response(credentials.signing_secret, intent_hash)
    return client.post("/v1/intent/verify", headers={**credentials.headers, **(headers or {})},
                       json={"original_intent_hash": intent_hash, "response": response})


def _usage(client, credentials):
    return client.get("/v1/tenant/usage", headers=credentials.headers).get_json()


def test_every_verify_counts_cleared_or_blocked(client, tenant):
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    assert _verify(client, tenant, intent_hash).get_json()["cleared"] is True
    assert _verify(client, tenant, intent_hash).get_json()["reason"] == "ReplayedIntent"
    assert _verify(client, tenant, "sha256:" + "d" * 64).get_json()["reason"] == "UnknownIntent"
    usage = _usage(client, tenant)
    assert (usage["usage_count"], usage["remaining"]) == (3, 50_000 - 3)


def test_the_limit_gives_429_and_usage_keeps_answering(client, make_tenant):
    tenant = make_tenant("free")
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    set_usage(client.application, tenant.tenant_id, 999)
    assert _verify(client, tenant, intent_hash).get_json()["cleared"] is True
    second = _generate(client, tenant)
    body = assert_envelope(second, 429, "monthly verification limit reached")
    assert body["retry_after"] > 0 and second.headers["Retry-After"] == str(body["retry_after"])
    assert_envelope(_verify(client, tenant, "sha256:" + "e" * 64), 429,
                    "monthly verification limit reached")
    assert _usage(client, tenant)["usage_count"] == 1000 and _usage(client, tenant)["remaining"] == 0
    assert client.post("/v1/tenant/rotate-key", headers=tenant.headers).status_code == 200


def test_a_refused_verify_consumes_nothing(client, make_tenant):
    tenant = make_tenant("free")
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    set_usage(client.application, tenant.tenant_id, 1000)
    assert _verify(client, tenant, intent_hash).status_code == 429
    with client.application.app_context():
        assert db.session.execute(select(Intent.consumed_at)).scalar_one() is None
        with unit_of_work():
            tenant_service.update_tenant(tenant.tenant_id, plan="starter")
    assert _verify(client, tenant, intent_hash).get_json()["cleared"] is True
    assert _usage(client, tenant)["usage_count"] == 1001


def test_raising_the_plan_lifts_the_limit_at_once(client, make_tenant):
    tenant = make_tenant("free")
    set_usage(client.application, tenant.tenant_id, 1000)
    assert _generate(client, tenant).status_code == 429
    with client.application.app_context(), unit_of_work():
        tenant_service.update_tenant(tenant.tenant_id, plan="pro")
    assert _generate(client, tenant).status_code == 200


def test_a_new_month_starts_at_zero(client, make_tenant):
    tenant = make_tenant("free")
    with time_machine.travel("2027-01-31T23:59:50Z", tick=False):
        set_usage(client.application, tenant.tenant_id, 1000)
        assert _generate(client, tenant).status_code == 429
    with time_machine.travel("2027-02-01T00:00:05Z", tick=False):
        intent_hash = _generate(client, tenant).get_json()["intent_hash"]
        assert _verify(client, tenant, intent_hash).get_json()["cleared"] is True
        assert _usage(client, tenant)["usage_count"] == 1


def test_the_months_last_second_says_retry_after_1_not_0(client, make_tenant):
    tenant = make_tenant("free")
    with time_machine.travel("2027-01-31T23:59:59.600Z", tick=False):
        set_usage(client.application, tenant.tenant_id, 1000)
        refused = _generate(client, tenant)
    body = assert_envelope(refused, 429, "monthly verification limit reached")
    assert body["retry_after"] == 1 and refused.headers["Retry-After"] == "1"


def test_enterprise_counts_without_a_limit(client, make_tenant):
    tenant = make_tenant("enterprise")
    set_usage(client.application, tenant.tenant_id, 10_000_000)
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    assert _verify(client, tenant, intent_hash).get_json()["cleared"] is True
    assert _usage(client, tenant)["usage_count"] == 10_000_001


def test_idempotent_retry_returns_the_same_result_and_counts_nothing(client, tenant):
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    response = scale_response(tenant.signing_secret, intent_hash, {"secret-payload": "s3cr3t-value"})
    key = {"Idempotency-Key": "retry-0001"}
    first = _verify(client, tenant, intent_hash, response, key)
    again = _verify(client, tenant, intent_hash, response, key)
    assert first.get_json() == again.get_json() == {
        "cleared": True, "reason": None, "payload": {"secret-payload": "s3cr3t-value"}}
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert _usage(client, tenant)["usage_count"] == 1
    with client.application.app_context():
        record = db.session.execute(select(IdempotencyRecord)).scalar_one()
    assert "s3cr3t-value" not in " ".join(str(v) for v in record.__dict__.values())
    without_key = _verify(client, tenant, intent_hash, response)
    assert without_key.get_json()["reason"] == "ReplayedIntent"


def test_idempotent_retry_of_a_blocked_verdict(client, tenant):
    intent_hash = "sha256:" + "9" * 64
    key = {"Idempotency-Key": "retry-blocked"}
    response = scale_response(tenant.signing_secret, intent_hash)
    first = _verify(client, tenant, intent_hash, response, key).get_json()
    assert first == _verify(client, tenant, intent_hash, response, key).get_json()
    assert first["reason"] == "UnknownIntent" and _usage(client, tenant)["usage_count"] == 1


def test_same_key_different_body_is_422(client, tenant):
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    key = {"Idempotency-Key": "retry-0002"}
    _verify(client, tenant, intent_hash, headers=key)
    other = scale_response(tenant.signing_secret, intent_hash, {"answer": "different"})
    assert_envelope(_verify(client, tenant, intent_hash, other, key), 422,
                    "Idempotency-Key was already used with a different request body")


def test_keys_are_per_tenant_and_expire_after_a_day(client, tenant, make_tenant):
    other = make_tenant("pro")
    key = {"Idempotency-Key": "shared-key"}
    with time_machine.travel(T0, tick=False):
        mine = _generate(client, tenant).get_json()["intent_hash"]
        theirs = _generate(client, other).get_json()["intent_hash"]
        assert _verify(client, tenant, mine, headers=key).get_json()["cleared"]
        assert _verify(client, other, theirs, headers=key).get_json()["cleared"]
    with time_machine.travel(T0 + 24 * 3600 + 1, tick=False):
        fresh = _generate(client, tenant).get_json()["intent_hash"]
        late = _verify(client, tenant, fresh, headers=key)
        assert late.get_json()["cleared"] and "Idempotent-Replayed" not in late.headers


def test_bad_idempotency_keys(client, tenant):
    for bad in ["", "k" * 256, "tab\tkey"]:
        response = _verify(client, tenant, "sha256:" + "a" * 64, headers={"Idempotency-Key": bad})
        assert_envelope(response, 400, "Idempotency-Key must be 1 to 255 printable ASCII characters")


def test_an_idempotency_key_with_a_comma_is_refused_and_nothing_judged(client, tenant):
    """Two Idempotency-Key headers reach the app as one value joined by a comma: judged under
    that joined key, a retry sending either key alone was judged again (ReplayedIntent)."""
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    for joined in ("first-key,second-key", "first-key, second-key", ","):
        response = _verify(client, tenant, intent_hash, headers={"Idempotency-Key": joined})
        assert_envelope(response, 400, "Idempotency-Key must be one value, without a comma "
                                        "(two Idempotency-Key headers arrive joined by one)")
    retried = _verify(client, tenant, intent_hash, headers={"Idempotency-Key": "first-key"})
    assert retried.get_json()["cleared"] and "Idempotent-Replayed" not in retried.headers


def test_count_never_passes_the_limit(client, make_tenant):
    tenant = make_tenant("free")
    set_usage(client.application, tenant.tenant_id, 998)
    hashes = [_generate(client, tenant).get_json()["intent_hash"] for _ in range(4)]
    statuses = [_verify(client, tenant, h).status_code for h in hashes]
    assert statuses == [200, 200, 429, 429]
    with client.application.app_context():
        total = db.session.execute(select(func.sum(MonthlyUsage.usage_count))).scalar_one()
    assert total == 1000
