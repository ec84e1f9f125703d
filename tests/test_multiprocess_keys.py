"""Key rotation across real gunicorn workers on PostgreSQL."""
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support import scale_response


def test_rotated_key_is_refused_by_every_worker_at_once(gunicorn, tenant):
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    old = {"X-Service-Key": tenant.api_key}
    warm_ids = [uuid.uuid4().hex for _ in range(40)]
    for request_id in warm_ids:
        assert requests.get(server.url + "/v1/tenant/usage", timeout=5,
                            headers={**old, "X-Request-Id": request_id}).status_code == 200
    rotated = requests.post(server.url + "/v1/tenant/rotate-key", headers=old, timeout=5)
    assert rotated.status_code == 200
    new_key = rotated.json()["new_key"]

    refused_ids = [uuid.uuid4().hex for _ in range(40)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(
            lambda request_id: requests.get(
                server.url + "/v1/tenant/usage", timeout=5,
                headers={**old, "X-Request-Id": request_id}).status_code,
            refused_ids))
    # Which workers the kernel picks is its choice; whichever it picks must refuse the key.
    assert statuses == [401] * 40
    fresh = requests.get(server.url + "/v1/tenant/usage", headers={"X-Service-Key": new_key},
                         timeout=5)
    assert fresh.status_code == 200


def test_concurrent_rotations_with_one_key_have_exactly_one_winner(gunicorn, make_tenant):
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    for _ in range(5):
        tenant = make_tenant("pro")
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(
                lambda _: requests.post(server.url + "/v1/tenant/rotate-key", timeout=10,
                                        headers={"X-Service-Key": tenant.api_key}),
                range(8)))
        statuses = sorted(response.status_code for response in responses)
        assert statuses == [200] + [401] * 7
        (winner,) = [r.json()["new_key"] for r in responses if r.status_code == 200]
        assert requests.get(server.url + "/v1/tenant/usage", timeout=5,
                            headers={"X-Service-Key": winner}).status_code == 200


# What a key needs to list and revoke keys (a new key holds only "intents" by default).
MANAGES_KEYS = ["usage:read", "keys:write"]


def _keys(server, headers):
    return requests.get(server.url + "/v1/tenant/keys", headers=headers, timeout=5)


def test_rollover_with_a_second_key_across_workers(gunicorn, tenant):
    """Create a second key, deploy it, revoke the first: no request fails on the way, and the
    revoked key is refused by whichever worker answers, from the revocation's response on."""
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    old = {"X-Service-Key": tenant.api_key}
    # The deployed key lists and revokes keys here: it holds those scopes (not the default).
    created = requests.post(server.url + "/v1/tenant/keys", headers=old, timeout=5,
                            json={"name": "next", "scopes": MANAGES_KEYS})
    assert created.status_code == 201
    new = {"X-Service-Key": created.json()["api_key"]}
    old_id = next(key["id"] for key in _keys(server, new).json()["keys"] if key["name"] != "next")
    with ThreadPoolExecutor(8) as pool:  # both keys work while the backend is redeployed
        statuses = list(pool.map(lambda i: requests.get(
            server.url + "/v1/tenant/usage", headers=(old, new)[i % 2], timeout=5).status_code,
            range(40)))
    assert statuses == [200] * 40
    assert requests.delete(server.url + f"/v1/tenant/keys/{old_id}", headers=new,
                           timeout=5).status_code == 200
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: requests.get(
            server.url + "/v1/tenant/usage", headers=(old, new)[i % 2], timeout=5).status_code,
            range(40)))
    assert statuses == [401, 200] * 20


def test_concurrent_revokes_of_the_last_two_keys_leave_exactly_one(gunicorn, make_tenant):
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    for _ in range(5):
        tenant = make_tenant("pro")
        first = {"X-Service-Key": tenant.api_key}
        created = requests.post(server.url + "/v1/tenant/keys", headers=first, timeout=5,
                                json={"name": "second", "scopes": MANAGES_KEYS}).json()
        second = {"X-Service-Key": created["api_key"]}
        first_id = next(key["id"] for key in _keys(server, first).json()["keys"]
                        if key["id"] != created["id"])
        barrier = threading.Barrier(2)

        def revoke(caller_and_target):
            caller, target = caller_and_target
            barrier.wait()
            return requests.delete(server.url + f"/v1/tenant/keys/{target}", headers=caller,
                                   timeout=10).status_code

        with ThreadPoolExecutor(2) as pool:  # each key revokes the other
            statuses = sorted(pool.map(revoke, [(first, created["id"]), (second, first_id)]))
        # One revocation wins; the other is refused: its key is the last one (409) or was just
        # revoked itself (401).
        assert statuses[0] == 200 and statuses[1] in (401, 409), statuses
        alive = [headers for headers in (first, second)
                 if _keys(server, headers).status_code == 200]
        assert len(alive) == 1
        assert len(_keys(server, alive[0]).json()["keys"]) == 1


def test_a_revoked_key_is_refused_by_every_worker_on_the_intent_endpoints(gunicorn, make_tenant):
    """Generate and verify take a principal from Redis, shared by every worker
    (app.tenants.key_cache): revoked, the key is refused by whichever worker answers from the
    revocation's response on, before anything is issued or counted."""
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    tenant = make_tenant("enterprise")
    old = {"X-Service-Key": tenant.api_key}

    def generate(headers):
        return requests.post(server.url + "/v1/intent/generate", headers=headers, timeout=5,
                             json={"user_token": "revoked-key-user-token"})

    with ThreadPoolExecutor(8) as pool:  # every worker acts on the kept principal
        warm = list(pool.map(lambda _: generate(old), range(40)))
    assert [response.status_code for response in warm] == [200] * 40
    created = requests.post(server.url + "/v1/tenant/keys", headers=old, timeout=5,
                            json={"name": "next", "scopes": MANAGES_KEYS + ["intents"]})
    new = {"X-Service-Key": created.json()["api_key"]}
    old_id = next(key["id"] for key in _keys(server, new).json()["keys"] if key["name"] != "next")
    assert requests.delete(server.url + f"/v1/tenant/keys/{old_id}", headers=new,
                           timeout=5).status_code == 200

    def verify(index):
        intent_hash = warm[index].json()["intent_hash"]
        return requests.post(server.url + "/v1/intent/verify", headers=old, timeout=5, json={
            "original_intent_hash": intent_hash,
            "response": scale_response(tenant.signing_secret, intent_hash)}).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: generate(old).status_code if i % 2 else verify(i),
                                 range(40)))
    assert statuses == [401] * 40
    usage = requests.get(server.url + "/v1/tenant/usage", headers=new, timeout=5).json()
    assert usage["usage_count"] == 0  # nothing counted for the revoked key
    intent_hash = warm[0].json()["intent_hash"]  # never consumed: the new key still verifies it
    cleared = requests.post(server.url + "/v1/intent/verify", headers=new, timeout=5, json={
        "original_intent_hash": intent_hash,
        "response": scale_response(tenant.signing_secret, intent_hash)})
    assert cleared.json()["cleared"] is True


# Races of one tenant's keys, many times over: more requests than a tenant's bucket holds.
RACING = {"AUTH_FAILURE_LIMIT": "1000 per minute", "RATE_LIMIT_CAPACITY": 1000}


def _rotate(server, headers):
    return requests.post(server.url + "/v1/tenant/rotate-key", headers=headers, timeout=10)


def _at_once(*calls):
    """Run the calls in threads released together, so their requests overlap on the workers."""
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_rotations_of_two_keys_both_succeed(gunicorn, make_tenant):
    """Every key operation locks the tenant's row first: two keys rotating themselves at once
    queue there, and neither is a deadlock's victim (a 503)."""
    server = gunicorn(workers=4, **RACING)
    tenant = make_tenant("pro")
    first = {"X-Service-Key": tenant.api_key}
    second = {"X-Service-Key": requests.post(
        server.url + "/v1/tenant/keys", headers=first, timeout=5,
        json={"name": "second"}).json()["api_key"]}
    for _ in range(15):
        rotated = _at_once(lambda: _rotate(server, first), lambda: _rotate(server, second))
        assert [response.status_code for response in rotated] == [200, 200]
        old = (first, second)
        first, second = ({"X-Service-Key": response.json()["new_key"]} for response in rotated)
        assert [requests.get(server.url + "/v1/tenant/usage", headers=headers,
                             timeout=5).status_code for headers in (*old, first, second)] == [
            401, 401, 200, 200]
    assert len(_keys(server, first).json()["keys"]) == 2


def test_a_key_revoked_while_it_rotates_gives_one_definite_answer_each(gunicorn, make_tenant):
    """Revocation first: the rotation's key is refused (401). Rotation first: the key to revoke
    is gone (404) and the new key works. Never both, never a 5xx."""
    server = gunicorn(workers=4, **RACING)
    tenant = make_tenant("pro")
    manager = {"X-Service-Key": tenant.api_key}
    (manager_id,) = [key["id"] for key in _keys(server, manager).json()["keys"]]
    for _ in range(15):
        created = requests.post(server.url + "/v1/tenant/keys", headers=manager, timeout=5,
                                json={"name": "rotating"}).json()
        rotating = {"X-Service-Key": created["api_key"]}
        rotated, revoked = _at_once(
            lambda: _rotate(server, rotating),
            lambda: requests.delete(server.url + f"/v1/tenant/keys/{created['id']}",
                                    headers=manager, timeout=10))
        outcome = (rotated.status_code, revoked.status_code)
        assert outcome in ((200, 404), (401, 200)), outcome
        assert requests.get(server.url + "/v1/tenant/usage", headers=rotating,
                            timeout=5).status_code == 401
        listed = {key["id"] for key in _keys(server, manager).json()["keys"]}
        if rotated.status_code == 200:
            new = {"X-Service-Key": rotated.json()["new_key"]}
            assert requests.get(server.url + "/v1/tenant/usage", headers=new,
                                timeout=5).status_code == 200
            (new_id,) = listed - {manager_id}
            assert new_id != created["id"]
            assert requests.delete(server.url + f"/v1/tenant/keys/{new_id}", headers=manager,
                                   timeout=5).status_code == 200
        else:
            assert listed == {manager_id}
    assert [key["id"] for key in _keys(server, manager).json()["keys"]] == [manager_id]
