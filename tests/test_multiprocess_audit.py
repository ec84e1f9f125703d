"""The audit log under concurrent changes across real gunicorn workers on PostgreSQL."""
from concurrent.futures import ThreadPoolExecutor

import requests


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
