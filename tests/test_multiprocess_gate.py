"""Single use, exact monthly counts and idempotent retries across real gunicorn workers."""
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support import scale_response, set_usage

ROOMY = {"AUTH_FAILURE_LIMIT": "1000 per minute", "RATE_LIMIT_CAPACITY": 1000}


def _all_at_once(count, call):
    """Run `call(i)` from `count` threads released together."""
    barrier = threading.Barrier(count)

    def run(index):
        barrier.wait()
        return call(index)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def _generate(server, credentials):
    response = requests.post(server.url + "/v1/intent/generate", headers=credentials.headers,
                             json={"user_token": "race-user-token"}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["intent_hash"]


def _verify(server, credentials, intent_hash, response, headers=None, request_id=None):
    headers = {**credentials.headers, **(headers or {})}
    if request_id:
        headers["X-Request-Id"] = request_id
    return requests.post(server.url + "/v1/intent/verify", headers=headers, timeout=30,
                         json={"original_intent_hash": intent_hash, "response": response})


def test_fifty_concurrent_verifies_of_one_intent_give_one_verdict(gunicorn, tenant):
    server = gunicorn(workers=4, **ROOMY)
    intent_hash = _generate(server, tenant)
    responses = [scale_response(tenant.signing_secret, intent_hash) for _ in range(50)]
    request_ids = [uuid.uuid4().hex for _ in range(50)]
    results = _all_at_once(50, lambda i: _verify(server, tenant, intent_hash, responses[i],
                                                 request_id=request_ids[i]))
    assert [r.status_code for r in results] == [200] * 50
    reasons = sorted(str(r.json()["reason"]) for r in results)
    assert reasons == ["None"] + ["ReplayedIntent"] * 49
    usage = requests.get(server.url + "/v1/tenant/usage", headers=tenant.headers, timeout=5).json()
    assert usage["usage_count"] == 50
    # Counted by outcome in the same statement as the month: the day adds up exactly.
    (today,) = requests.get(server.url + "/v1/tenant/usage/daily?days=1", headers=tenant.headers,
                            timeout=5).json()["days"]
    assert (today["verifications"], today["cleared"]) == (50, 1)
    assert today["blocked"]["ReplayedIntent"] == 49 and sum(today["blocked"].values()) == 49


@pytest.mark.parametrize("earlier", [{0: 990}, {0: 500, 7: 300, 12: 190}],
                         ids=["one row", "over shards"])
def test_concurrent_verifies_at_the_plan_limit_count_exactly(app, gunicorn, make_tenant,
                                                             earlier):
    """990 counted this month, on one row or (an unlimited plan's, before a move to this one)
    over several shards: ten more clear, however many workers race for them."""
    server = gunicorn(workers=4, **ROOMY)
    tenant = make_tenant("free")
    hashes = [_generate(server, tenant) for _ in range(30)]
    set_usage(app, tenant.tenant_id, earlier)
    results = _all_at_once(30, lambda i: _verify(
        server, tenant, hashes[i], scale_response(tenant.signing_secret, hashes[i])))
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200] * 10 + [429] * 20
    assert all(r.json()["error"] == "monthly verification limit reached"
               for r in results if r.status_code == 429)
    usage = requests.get(server.url + "/v1/tenant/usage", headers=tenant.headers, timeout=5).json()
    assert (usage["usage_count"], usage["remaining"]) == (1000, 0)
    # The 990 were set by hand; the ten counted verifies are the day's, the refused ones none.
    (today,) = requests.get(server.url + "/v1/tenant/usage/daily?days=1", headers=tenant.headers,
                            timeout=5).json()["days"]
    assert (today["verifications"], today["cleared"]) == (10, 10)
    late = _verify(server, tenant, hashes[0], scale_response(tenant.signing_secret, hashes[0]))
    assert late.status_code == 429


def test_an_unlimited_plans_concurrent_verifies_are_each_counted_once(gunicorn, make_tenant):
    """Counted on the shards of the workers' connections: the month and the day are exact."""
    server = gunicorn(workers=4, **ROOMY)
    tenant = make_tenant("enterprise")
    hashes = [_generate(server, tenant) for _ in range(40)]
    results = _all_at_once(40, lambda i: _verify(
        server, tenant, hashes[i], scale_response(tenant.signing_secret, hashes[i])))
    assert [r.json()["cleared"] for r in results] == [True] * 40
    usage = requests.get(server.url + "/v1/tenant/usage", headers=tenant.headers, timeout=5).json()
    assert usage["usage_count"] == 40
    (today,) = requests.get(server.url + "/v1/tenant/usage/daily?days=1", headers=tenant.headers,
                            timeout=5).json()["days"]
    assert (today["verifications"], today["cleared"]) == (40, 40)


def test_concurrent_idempotent_retries_execute_once(gunicorn, tenant):
    server = gunicorn(workers=4, **ROOMY)
    intent_hash = _generate(server, tenant)
    response = scale_response(tenant.signing_secret, intent_hash, {"answer": "once"})
    key = {"Idempotency-Key": "one-execution-" + uuid.uuid4().hex}
    results = _all_at_once(12, lambda i: _verify(server, tenant, intent_hash, response, key))
    assert all(r.status_code == 200 for r in results)
    assert all(r.json() == {"cleared": True, "reason": None, "payload": {"answer": "once"}}
               for r in results)
    fresh = [r for r in results if r.headers.get("Idempotent-Replayed") != "true"]
    assert len(fresh) == 1
    usage = requests.get(server.url + "/v1/tenant/usage", headers=tenant.headers, timeout=5).json()
    assert usage["usage_count"] == 1
