"""Tenant self-service (CONTRACT.md): several API keys, the audit log, daily usage by outcome."""
import base64
import json
import threading
import time

import pytest
import time_machine
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.conftest import TEST_DATABASE_URL
from tests.support import (assert_envelope, postgresql_connection, scale_response,
                           wait_for_a_lock_wait)

T0 = 1_800_000_000  # 2027-01-15 08:00 UTC


def _create_key(client, headers, **body):
    return client.post("/v1/tenant/keys", headers=headers, json=body)


def _usage(client, key):
    return client.get("/v1/tenant/usage", headers={"X-Service-Key": key})


def test_several_keys_act_for_one_tenant_and_are_shown_once(client, tenant, leak_watch):
    created = _create_key(client, tenant.headers, name="deploy-2")
    assert created.status_code == 201 and created.headers["Cache-Control"] == "no-store"
    body = created.get_json()
    leak_watch.add(body["api_key"])
    assert set(body) == {"id", "name", "prefix", "scopes", "created_at", "expires_at", "api_key"}
    assert body["prefix"] == body["api_key"][:15] and body["expires_at"] is None
    assert body["scopes"] == ["intents"]
    for key in (tenant.api_key, body["api_key"]):
        assert _usage(client, key).get_json()["email"] == tenant.email
    listed = client.get("/v1/tenant/keys", headers=tenant.headers).get_json()["keys"]
    assert sorted(key["name"] for key in listed) == ["default", "deploy-2"]
    assert all(set(key) == {"id", "name", "prefix", "scopes", "created_at", "expires_at"}
               for key in listed)
    assert tenant.api_key not in json.dumps(listed) and body["api_key"] not in json.dumps(listed)


def test_a_revoked_key_is_refused_at_once_and_the_last_one_stays(client, tenant):
    second = _create_key(client, tenant.headers, name="second",
                         scopes=["usage:read", "keys:write"]).get_json()
    first_id = next(key["id"] for key in
                    client.get("/v1/tenant/keys", headers=tenant.headers).get_json()["keys"]
                    if key["id"] != second["id"])
    headers = {"X-Service-Key": second["api_key"]}
    revoked = client.delete(f"/v1/tenant/keys/{first_id}", headers=headers)
    assert revoked.status_code == 200 and revoked.get_json()["revoked_at"] is not None
    assert_envelope(_usage(client, tenant.api_key), 401, "Invalid or inactive API key")
    assert_envelope(client.delete(f"/v1/tenant/keys/{second['id']}", headers=headers), 409,
                    "this is the tenant's last active API key: create another one first")
    assert_envelope(client.delete(f"/v1/tenant/keys/{first_id}", headers=headers), 404,
                    "API key not found")
    assert _usage(client, second["api_key"]).status_code == 200


def test_a_change_in_flight_with_a_key_revoked_meanwhile_is_refused(client, tenant):
    """Authentication reads the key before the change locks the tenant's row. A revocation
    that commits in between (here holding that lock while the change waits for it) has
    answered: the change is refused as the key is now, and nothing is written."""
    if not TEST_DATABASE_URL:
        pytest.skip("PostgreSQL's row locks hold the change between authentication and write")
    other = _create_key(client, tenant.headers, name="other",
                        scopes=["usage:read", "keys:write"]).get_json()
    other_headers = {"X-Service-Key": other["api_key"]}
    revoking = postgresql_connection()
    try:
        cursor = revoking.cursor()
        cursor.execute("SELECT id FROM tenants WHERE id = %s FOR UPDATE", (tenant.tenant_id,))
        answers = []
        changing = threading.Thread(target=lambda: answers.append(
            _create_key(client, tenant.headers, name="minted", scopes=["signing:write"])))
        changing.start()
        wait_for_a_lock_wait(revoking.dsn)  # authenticated, now waiting for the tenant's row
        cursor.execute("UPDATE api_keys SET revoked_at = %s WHERE tenant_id = %s AND id <> %s",
                       (int(time.time()), tenant.tenant_id, other["id"]))
        revoking.commit()
        changing.join(timeout=30)
    finally:
        revoking.close()
    assert_envelope(answers[0], 401, "Invalid or inactive API key")
    listed = client.get("/v1/tenant/keys", headers=other_headers).get_json()["keys"]
    assert [key["name"] for key in listed] == ["other"]


def test_at_most_ten_active_keys(client, tenant):
    for index in range(9):
        assert _create_key(client, tenant.headers, name=f"k{index}").status_code == 201
    assert_envelope(_create_key(client, tenant.headers, name="eleventh"), 409,
                    "a tenant holds at most 10 active API keys: revoke one first")


def test_an_expired_key_is_refused_like_a_wrong_one(client, tenant):
    with time_machine.travel(T0, tick=False):
        created = _create_key(client, tenant.headers, name="short", expires_in=60).get_json()
        assert created["expires_at"] == T0 + 60
        assert _usage(client, created["api_key"]).status_code == 200
    with time_machine.travel(T0 + 61, tick=False):
        assert_envelope(_usage(client, created["api_key"]), 401, "Invalid or inactive API key")
        names = [key["name"] for key in
                 client.get("/v1/tenant/keys", headers=tenant.headers).get_json()["keys"]]
        assert names == ["default"]


def test_a_key_lasts_the_seconds_asked_counted_from_the_exact_time(client, tenant):
    # Asked at T0 + 0.49 s for 3 s: the key works at T0 + 3.4 s (from the truncated second it
    # stopped at T0 + 3, 2.51 s after it was made) and stops at the next whole second.
    with time_machine.travel(T0 + 0.49, tick=False):
        created = _create_key(client, tenant.headers, name="brief", expires_in=3).get_json()
    assert created["expires_at"] == T0 + 4
    with time_machine.travel(T0 + 3.4, tick=False):
        assert _usage(client, created["api_key"]).status_code == 200
    with time_machine.travel(T0 + 4, tick=False):
        assert_envelope(_usage(client, created["api_key"]), 401, "Invalid or inactive API key")


def test_a_rotated_key_keeps_the_expiry_of_the_key_it_replaces(client, tenant):
    with time_machine.travel(T0 + 0.49, tick=False):
        created = _create_key(client, tenant.headers, name="brief", expires_in=60).get_json()
    with time_machine.travel(T0 + 10.8, tick=False):
        rotated = client.post("/v1/tenant/rotate-key", headers={"X-Service-Key": created["api_key"]})
        assert rotated.status_code == 200
        listed = client.get("/v1/tenant/keys", headers=tenant.headers).get_json()["keys"]
    assert [key["expires_at"] for key in listed if key["name"] == "brief"] == [T0 + 61]


@pytest.mark.parametrize("body, error", [
    ({}, "name is required"),
    ({"name": ""}, "name must be 1 to 100 characters"),
    ({"name": "   "}, "name must be 1 to 100 characters"),
    ({"name": "a\x00b"}, "name must not contain control characters"),
    ({"name": "a\u2028b"}, "name must not contain control characters"),
    ({"name": "ops\u200bkey"}, "name must not contain control characters"),
    ({"name": "key\u202egnp.exe"}, "name must not contain control characters"),
    # Characters that render as nothing: a Hangul filler alone, a soft hyphen, a tag character.
    ({"name": "\u3164"}, "name must not contain control characters"),
    ({"name": "ab\u00adc"}, "name must not contain control characters"),
    ({"name": "\U000e0041x"}, "name must not contain control characters"),
    ({"name": "\u2800"}, "name must not contain control characters"),  # the Braille blank
    # Variation selectors alone: they change how the character before them is drawn.
    ({"name": "\ufe0f"}, "name must contain a character to read"),
    ({"name": " \u180b\U000e0100 "}, "name must contain a character to read"),
    ({"name": "x", "expires_in": 0}, "expires_in must be an integer between 1 and 315360000 "
                                     "seconds"),
    ({"name": "x", "expires_in": "60"}, "expires_in must be an integer between 1 and 315360000 "
                                        "seconds"),
    ({"name": "x", "key": "key_live_" + "0" * 48}, "unknown field: key"),
])
def test_bad_key_requests_are_400(client, tenant, body, error):
    assert_envelope(_create_key(client, tenant.headers, **body), 400, error)


def test_key_names_are_trimmed(client, tenant):
    assert _create_key(client, tenant.headers, name="  deploy 2  ").get_json()["name"] == "deploy 2"


def test_a_key_name_may_hold_variation_selectors_beside_what_they_change(client, tenant):
    assert _create_key(client, tenant.headers, name="prod \u2764\ufe0f").get_json()["name"] == \
        "prod \u2764\ufe0f"


def test_rotate_key_replaces_only_the_calling_key(client, tenant):
    other = _create_key(client, tenant.headers, name="other").get_json()
    rotated = client.post("/v1/tenant/rotate-key", headers=tenant.headers)
    assert rotated.status_code == 200 and rotated.headers["Cache-Control"] == "no-store"
    new_key = rotated.get_json()["new_key"]
    assert_envelope(_usage(client, tenant.api_key), 401, "Invalid or inactive API key")
    assert _usage(client, new_key).status_code == 200
    assert _usage(client, other["api_key"]).status_code == 200
    names = sorted(key["name"] for key in
                   client.get("/v1/tenant/keys", headers=tenant.headers | {
                       "X-Service-Key": new_key}).get_json()["keys"])
    assert names == ["default", "other"]


def _entries(client, key, query=""):
    response = client.get(f"/v1/tenant/audit-log{query}", headers={"X-Service-Key": key})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["entries"]


def test_every_kind_of_change_is_audited_with_its_actor(client, runner, tenant, leak_watch):
    admin = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "ops",
                                           "--json"]).stdout)
    leak_watch.add(admin["api_key"], admin["signing_secret"])
    admin_headers = {"X-Service-Key": admin["api_key"]}
    base = f"/v1/admin/tenants/{tenant.tenant_id}"
    request_ids = {}

    def call(method, path, headers, action, **kwargs):
        request_id = f"audit-{action}"
        response = getattr(client, method)(path, headers={**headers, "X-Request-Id": request_id},
                                           **kwargs)
        assert response.status_code in (200, 201), response.get_data(as_text=True)
        request_ids[action] = request_id
        return response.get_json()

    second = call("post", "/v1/tenant/keys", tenant.headers, "api_key.created",
                  json={"name": "second", "scopes": ["signing:write", "usage:read"]})
    leak_watch.add(second["api_key"])
    key = {"X-Service-Key": second["api_key"]}
    call("post", "/v1/tenant/signing-secret/rotate", key, "signing_secret.rotated", json={})
    public_key = base64.b64encode(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
    signing_key = call("post", f"{base}/signing-keys", admin_headers, "signing_key.added",
                       json={"public_key": public_key})
    call("put", f"{base}/signature-scheme", admin_headers, "signature_scheme.changed",
         json={"scheme": "ed25519"})
    call("put", f"{base}/signature-scheme", admin_headers, "signature_scheme.changed.back",
         json={"scheme": "bound"})
    call("delete", f"/v1/tenant/signing-keys/{signing_key['id']}", key, "signing_key.revoked")
    call("patch", base, admin_headers, "plan.changed", json={"plan": "pro"})
    rotated = call("post", "/v1/tenant/rotate-key", key, "api_key.rotated")
    leak_watch.add(rotated["new_key"])
    first_id = next(k["id"] for k in call("get", f"{base}/keys", admin_headers, "list")["keys"]
                    if k["name"] == "default")
    call("delete", f"{base}/keys/{first_id}", admin_headers, "api_key.revoked")
    assert runner.invoke(args=["tenants", "deactivate", tenant.email]).exit_code == 0
    assert runner.invoke(args=["tenants", "activate", tenant.email]).exit_code == 0

    entries = _entries(client, rotated["new_key"], "?limit=200")
    actions = [entry["action"] for entry in reversed(entries)]
    assert actions == ["tenant.created", "api_key.created", "signing_secret.rotated",
                       "signing_key.added", "signature_scheme.changed",
                       "signature_scheme.changed", "signing_key.revoked", "plan.changed",
                       "api_key.rotated", "api_key.revoked", "tenant.deactivated",
                       "tenant.activated"]
    assert [entry["id"] for entry in entries] == list(range(12, 0, -1))
    by_action = {entry["action"]: entry for entry in reversed(entries)}
    assert by_action["api_key.created"]["actor"] == f"key:{tenant.api_key[:15]}"
    assert by_action["api_key.created"]["request_id"] == "audit-api_key.created"
    assert by_action["api_key.created"]["address"] == "127.0.0.1"
    assert by_action["signing_secret.rotated"]["actor"] == f"key:{second['api_key'][:15]}"
    assert by_action["signature_scheme.changed"]["actor"] == "admin:ops"
    assert by_action["signature_scheme.changed"]["details"] == {
        "old": "ed25519", "new": "bound", "grace_seconds": 0}
    assert by_action["plan.changed"]["details"] == {"old": "starter", "new": "pro"}
    assert by_action["api_key.rotated"]["details"]["prefix"] == second["api_key"][:15]
    assert by_action["tenant.deactivated"]["actor"] == "cli"
    assert by_action["tenant.deactivated"]["request_id"] is None
    text = json.dumps(entries)
    for secret in (tenant.api_key, second["api_key"], rotated["new_key"], admin["api_key"],
                   tenant.signing_secret):
        assert secret not in text


def test_a_key_sent_as_the_request_id_reaches_no_log_or_audit_entry(client, tenant, leak_watch):
    """The request id is written into every log line and audit entry of the request (and its
    audit webhook event): a caller's id holding a key is replaced like any other bad one."""
    for supplied in (tenant.api_key, "trace-" + tenant.api_key, tenant.signing_secret):
        created = client.post("/v1/tenant/keys", json={"name": "traced"},
                              headers={**tenant.headers, "X-Request-Id": supplied})
        assert created.status_code == 201
        leak_watch.add(created.get_json()["api_key"])
        request_id = created.headers["X-Request-Id"]
        assert tenant.api_key not in request_id and "_live_" not in request_id
        assert len(request_id) == 32
    entries = client.get("/v1/tenant/audit-log", headers=tenant.headers).get_json()["entries"]
    assert "_live_" not in json.dumps([entry["request_id"] for entry in entries])


def test_the_audit_log_pages_newest_first(client, tenant):
    for index in range(4):
        _create_key(client, tenant.headers, name=f"k{index}")
    first = _entries(client, tenant.api_key, "?limit=2")
    assert [entry["id"] for entry in first] == [5, 4]
    second = _entries(client, tenant.api_key, f"?limit=2&before={first[-1]['id']}")
    assert [entry["id"] for entry in second] == [3, 2]
    assert [entry["id"] for entry in _entries(client, tenant.api_key, "?before=2")] == [1]
    for query, error in [("?limit=0", "limit must be an integer between 1 and 200"),
                         ("?limit=201", "limit must be an integer between 1 and 200"),
                         ("?limit=x", "limit must be an integer between 1 and 200"),
                         ("?before=-1", "before must be an integer between 1 and "
                                        "2147483647")]:
        assert_envelope(client.get(f"/v1/tenant/audit-log{query}", headers=tenant.headers), 400,
                        error)


def _verify(client, tenant, intent_hash, response):
    return client.post("/v1/intent/verify", headers=tenant.headers,
                       json={"original_intent_hash": intent_hash, "response": response})


def _generate(client, tenant):
    return client.post("/v1/intent/generate", headers=tenant.headers,
                       json={"user_token": "daily-user-token"}).get_json()["intent_hash"]


def test_daily_usage_by_outcome_adds_up_to_the_month(client, tenant):
    with time_machine.travel(T0 - 86400, tick=False):  # yesterday: one cleared
        intent_hash = _generate(client, tenant)
        assert _verify(client, tenant, intent_hash,
                       scale_response(tenant.signing_secret, intent_hash)).status_code == 200
    with time_machine.travel(T0, tick=False):
        cleared = _generate(client, tenant)
        response = scale_response(tenant.signing_secret, cleared)
        assert _verify(client, tenant, cleared, response).get_json()["cleared"]
        assert _verify(client, tenant, cleared, response).get_json()["reason"] == "ReplayedIntent"
        bad = _generate(client, tenant)
        forged = scale_response("sig_live_" + "0" * 64, bad)
        assert _verify(client, tenant, bad, forged).get_json()["reason"] == "InvalidSignature"
        unknown = "sha256:" + "f" * 64
        assert _verify(client, tenant, unknown, forged).get_json()["reason"] == "UnknownIntent"
        days = client.get("/v1/tenant/usage/daily?days=3", headers=tenant.headers).get_json()
        usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    zero = {"UnknownIntent": 0, "ExpiredIntent": 0, "ReplayedIntent": 0, "InvalidSignature": 0,
            "TimestampOutOfWindow": 0, "ReplayedResponse": 0}
    assert days == {"days": [
        {"date": "2027-01-13", "verifications": 0, "cleared": 0, "blocked": zero},
        {"date": "2027-01-14", "verifications": 1, "cleared": 1, "blocked": zero},
        {"date": "2027-01-15", "verifications": 4, "cleared": 1, "blocked": {
            **zero, "ReplayedIntent": 1, "InvalidSignature": 1, "UnknownIntent": 1}},
    ]}
    assert usage["usage_count"] == sum(day["verifications"] for day in days["days"]) == 5


def test_daily_usage_defaults_to_30_days_and_refuses_bad_days(client, tenant):
    days = client.get("/v1/tenant/usage/daily", headers=tenant.headers).get_json()["days"]
    assert len(days) == 30 and days == sorted(days, key=lambda day: day["date"])
    assert len(client.get("/v1/tenant/usage/daily?days=92",
                          headers=tenant.headers).get_json()["days"]) == 92
    for bad in ("0", "93", "-1", "1.5", "abc", "", "٣"):
        assert_envelope(client.get(f"/v1/tenant/usage/daily?days={bad}", headers=tenant.headers),
                        400, "days must be an integer between 1 and 92")


def test_admin_keys_get_403_on_self_service_and_reach_it_through_the_admin_api(client, runner,
                                                                                 tenant):
    admin = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "ops2",
                                           "--json"]).stdout)
    headers = {"X-Service-Key": admin["api_key"]}
    for path in ("/v1/tenant/keys", "/v1/tenant/audit-log", "/v1/tenant/usage/daily"):
        assert_envelope(client.get(path, headers=headers), 403,
                        "this endpoint requires a tenant key")
    base = f"/v1/admin/tenants/{tenant.tenant_id}"
    created = client.post(f"{base}/keys", headers=headers, json={"name": "by-admin"})
    assert created.status_code == 201
    assert _usage(client, created.get_json()["api_key"]).status_code == 200
    assert len(client.get(f"{base}/usage/daily?days=7", headers=headers).get_json()["days"]) == 7
    assert client.get(f"{base}/audit-log", headers=headers).get_json()["entries"][0][
        "actor"] == "admin:ops2"
    assert_envelope(client.get("/v1/admin/tenants/424242/keys", headers=headers), 404,
                    "tenant not found")


def test_the_cli_manages_keys_and_shows_the_audit_and_daily_bars(client, runner, tenant):
    added = runner.invoke(args=["tenants", "keys", "add", tenant.email, "--name", "cli-key"])
    assert added.exit_code == 0, added.output
    api_key = added.stdout.split(": ")[1].splitlines()[0]
    assert _usage(client, api_key).status_code == 200
    listed = runner.invoke(args=["tenants", "keys", "list", str(tenant.tenant_id)]).stdout
    lines = listed.splitlines()
    assert lines[0] == "ID\tNAME\tPREFIX\tSCOPES\tCREATED_AT\tEXPIRES_AT"
    assert any(line.split("\t")[1:3] == ["cli-key", api_key[:15] + "..."] for line in lines)
    assert api_key not in listed
    key_id = next(line.split("\t")[0] for line in lines[1:] if "\tcli-key\t" in line)
    revoked = runner.invoke(args=["tenants", "keys", "revoke", tenant.email, key_id])
    assert revoked.exit_code == 0 and "revoked" in revoked.stdout
    audit = runner.invoke(args=["tenants", "audit", tenant.email]).stdout.splitlines()
    assert audit[0] == "ID\tAT\tACTION\tACTOR\tADDRESS\tDETAILS"
    assert audit[1].split("\t")[2:4] == ["api_key.revoked", "cli"]

    for _ in range(3):
        intent_hash = _generate(client, tenant)
        _verify(client, tenant, intent_hash, scale_response(tenant.signing_secret, intent_hash))
    intent_hash = _generate(client, tenant)
    _verify(client, tenant, intent_hash, scale_response("sig_live_" + "1" * 64, intent_hash))
    table = runner.invoke(args=["tenants", "usage", tenant.email, "--days", "3"])
    assert table.exit_code == 0, table.output
    rows = table.stdout.splitlines()
    assert rows[0].split()[:4] == ["DATE", "VERIFIED", "CLEARED", "BLOCKED"]
    assert len(rows) == 4
    today = rows[-1].split()
    assert today[1:4] == ["4", "3", "1"] and today[4] == "#" * 30 + "x" * 10
    assert rows[1].split()[1:4] == ["0", "0", "0"]
    bad = runner.invoke(args=["tenants", "usage", tenant.email, "--days", "93"])
    assert bad.exit_code == 2
