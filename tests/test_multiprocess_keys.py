"""Key rotation across real gunicorn workers on PostgreSQL."""
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests


def test_rotated_key_is_refused_by_every_worker_at_once(gunicorn, tenant):
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    old = {"X-Service-Key": tenant.api_key}
    warm_ids = [uuid.uuid4().hex for _ in range(40)]
    for request_id in warm_ids:
        assert requests.get(server.url + "/v1/tenant/usage", headers={**old, "X-Request-Id": request_id},
                            timeout=5).status_code == 200
    rotated = requests.post(server.url + "/v1/tenant/rotate-key", headers=old, timeout=5)
    assert rotated.status_code == 200
    new_key = rotated.json()["new_key"]

    refused_ids = [uuid.uuid4().hex for _ in range(40)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(
            lambda request_id: requests.get(server.url + "/v1/tenant/usage", timeout=5,
                                            headers={**old, "X-Request-Id": request_id}).status_code,
            refused_ids))
    assert statuses == [401] * 40
    assert len(server.pids_for(refused_ids)) >= 2, "requests should reach several workers"
    fresh = requests.get(server.url + "/v1/tenant/usage", headers={"X-Service-Key": new_key}, timeout=5)
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
