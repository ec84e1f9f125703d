"""The audit log under concurrent changes across real gunicorn workers on PostgreSQL."""
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support import scale_response


def _entries(server, admin_headers, tenant_id):
    answer = requests.get(server.url + f"/v1/admin/tenants/{tenant_id}/audit-log",
                          headers=admin_headers, timeout=5)
    assert answer.status_code == 200
    return answer.json()["entries"]


def test_concurrent_identical_tenant_changes_are_recorded_once(gunicorn, make_tenant,
                                                               admin_headers):
    """Eight workers asked at once for one change make it once: one entry each, never one
    for a change that found it already made (judged on the row read before the lock)."""
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    tenant = make_tenant("starter")
    url = server.url + f"/v1/admin/tenants/{tenant.tenant_id}"
    for change in ({"plan": "pro"}, {"active": False}, {"signature_scheme": "payload"}):
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(
                lambda _: requests.patch(url, json=change, headers=admin_headers,
                                         timeout=10).status_code, range(8)))
        assert statuses == [200] * 8
    actions = [(entry["action"], entry["details"].get("old"), entry["details"].get("new"))
               for entry in _entries(server, admin_headers, tenant.tenant_id)]
    assert actions == [("signature_scheme.changed", "bound", "payload"),
                       ("tenant.deactivated", None, None),
                       ("plan.changed", "starter", "pro"),
                       ("tenant.created", None, None)]


def test_concurrent_signing_secret_rotations_keep_the_one_before_as_previous(
        gunicorn, make_tenant):
    """Rotations with a grace, eight at once on four workers: in the order the audit log
    records them, the last rotation's secret signs and so does the one before it (its grace),
    as if they had come one after another."""
    server = gunicorn(workers=4, AUTH_FAILURE_LIMIT="1000 per minute")
    tenant = make_tenant("pro")

    def rotate(_):
        answer = requests.post(server.url + "/v1/tenant/signing-secret/rotate",
                               json={"grace_seconds": 3600}, headers=tenant.headers, timeout=10)
        assert answer.status_code == 200
        return answer.headers["X-Request-Id"], answer.json()["signing_secret"]

    with ThreadPoolExecutor(8) as pool:
        secret_of = dict(pool.map(rotate, range(8)))
    entries = requests.get(server.url + "/v1/tenant/audit-log", headers=tenant.headers,
                           timeout=5).json()["entries"]
    newest_first = [entry["request_id"] for entry in entries
                    if entry["action"] == "signing_secret.rotated"]
    assert len(newest_first) == 8
    cleared = []
    for request_id in newest_first:
        intent_hash = requests.post(server.url + "/v1/intent/generate", headers=tenant.headers,
                                    json={"user_token": "rotation-token"},
                                    timeout=5).json()["intent_hash"]
        verdict = requests.post(server.url + "/v1/intent/verify", headers=tenant.headers,
                                timeout=5, json={"original_intent_hash": intent_hash,
                                                 "response": scale_response(
                                                     secret_of[request_id], intent_hash)})
        cleared.append(verdict.json()["cleared"])
    assert cleared == [True, True] + [False] * 6
