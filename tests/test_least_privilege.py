"""Least privilege (CONTRACT.md, Authentication "Scopes"): a backend's key generates and
verifies but cannot mint signing power; the payload scheme is an operator's choice; one entry per
public key; a cleared payload comes back as it was signed."""
import base64
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support import Credentials, assert_envelope, scale_response
from tests.test_signing_keys import KeyPair

ALL_SCOPES = ["intents", "usage:read", "keys:write", "signing:write", "webhooks:write"]


def _new_key(client, headers, **body):
    return client.post("/v1/tenant/keys", headers=headers, json={"name": "backend", **body})


def _as(tenant, api_key):
    return Credentials(tenant.tenant_id, tenant.email, api_key, tenant.signing_secret)


def _scoped(client, tenant, leak_watch, scopes):
    created = _new_key(client, tenant.headers, scopes=scopes)
    assert created.status_code == 201, created.get_data(as_text=True)
    leak_watch.add(created.get_json()["api_key"])
    return _as(tenant, created.get_json()["api_key"])


def _generate(client, credentials):
    return client.post("/v1/intent/generate", headers=credentials.headers,
                       json={"user_token": "least-privilege-user"})


def _verify(client, credentials, intent_hash, response):
    return client.post("/v1/intent/verify", headers=credentials.headers,
                       json={"original_intent_hash": intent_hash, "response": response})


# Every management operation of a tenant key, with the scope it needs.
MANAGEMENT = [
    ("get", "/v1/tenant/keys", None, "usage:read"),
    ("post", "/v1/tenant/keys", {"name": "x"}, "keys:write"),
    ("delete", "/v1/tenant/keys/ak_000000000000000000000000", None, "keys:write"),
    ("get", "/v1/tenant/signing-keys", None, "usage:read"),
    ("post", "/v1/tenant/signing-keys", {"public_key": KeyPair().raw_base64}, "signing:write"),
    ("delete", "/v1/tenant/signing-keys/sk_000000000000000000000000", None, "signing:write"),
    ("put", "/v1/tenant/signature-scheme", {"scheme": "bound"}, "signing:write"),
    ("post", "/v1/tenant/signing-secret/rotate", {}, "signing:write"),
    ("get", "/v1/tenant/audit-log", None, "usage:read"),
    ("get", "/v1/tenant/usage/daily", None, "usage:read"),
]


def test_a_default_key_generates_and_verifies_but_manages_nothing(client, tenant, leak_watch):
    created = _new_key(client, tenant.headers)
    assert created.status_code == 201 and created.get_json()["scopes"] == ["intents"]
    backend = _as(tenant, created.get_json()["api_key"])
    leak_watch.add(backend.api_key)
    intent_hash = _generate(client, backend).get_json()["intent_hash"]
    verdict = _verify(client, backend, intent_hash, scale_response(tenant.signing_secret,
                                                                   intent_hash)).get_json()
    assert verdict["cleared"] is True
    assert client.get("/v1/tenant/usage", headers=backend.headers).status_code == 200
    for method, path, body, scope in MANAGEMENT:
        kwargs = {} if body is None else {"json": body}
        assert_envelope(getattr(client, method)(path, headers=backend.headers, **kwargs), 403,
                        f"this key lacks the scope {scope}")
    # Nothing was changed by the refused calls: the tenant's secret still clears.
    intent_hash = _generate(client, backend).get_json()["intent_hash"]
    assert _verify(client, backend, intent_hash, scale_response(
        tenant.signing_secret, intent_hash)).get_json()["cleared"] is True


def test_rotation_keeps_the_scopes(client, tenant, leak_watch):
    backend = _scoped(client, tenant, leak_watch, ["intents", "usage:read"])
    rotated = client.post("/v1/tenant/rotate-key", headers=backend.headers)
    assert rotated.status_code == 200
    new_key = rotated.get_json()["new_key"]
    leak_watch.add(new_key)
    listed = client.get("/v1/tenant/keys", headers={"X-Service-Key": new_key}).get_json()["keys"]
    assert sorted(key["scopes"] for key in listed) == [["intents", "usage:read"], ALL_SCOPES]
    assert_envelope(client.post("/v1/tenant/signing-secret/rotate",
                                headers={"X-Service-Key": new_key}, json={}),
                    403, "this key lacks the scope signing:write")


def test_no_key_grants_more_than_it_holds(client, tenant, leak_watch):
    keys_only = _scoped(client, tenant, leak_watch, ["keys:write"])
    for asked in ({"scopes": ["keys:write", "signing:write"]}, {"scopes": ALL_SCOPES}, {}):
        # {} asks for the default, intents, which this key does not hold either.
        assert_envelope(_new_key(client, keys_only.headers, **asked), 403,
                        "a key cannot grant scopes it does not hold")
    same = _new_key(client, keys_only.headers, scopes=["keys:write"])
    assert same.status_code == 201 and same.get_json()["scopes"] == ["keys:write"]
    leak_watch.add(same.get_json()["api_key"])
    intents_only = _scoped(client, tenant, leak_watch, ["intents"])
    assert_envelope(_new_key(client, intents_only.headers, scopes=["intents"]), 403,
                    "this key lacks the scope keys:write")


@pytest.mark.parametrize("scopes, error", [
    (["intents", "admin"], "scopes must be drawn from: intents, usage:read, keys:write, "
                           "signing:write, webhooks:write"),
    ([], "scopes must list 1 to 10 scope names"),
    (["intents"] * 11, "scopes must list 1 to 10 scope names"),
    ("intents", "scopes must be a list of scope names"),
    ([1], "scopes must be drawn from: intents, usage:read, keys:write, signing:write, "
          "webhooks:write"),
    ([None], "scopes must be drawn from: intents, usage:read, keys:write, signing:write, "
             "webhooks:write"),
])
def test_scopes_are_validated(client, tenant, scopes, error):
    assert_envelope(_new_key(client, tenant.headers, scopes=scopes), 400, error)


def test_scopes_come_back_in_canonical_order_once_each(client, tenant, leak_watch):
    created = _new_key(client, tenant.headers, scopes=["usage:read", "intents", "usage:read"])
    assert created.status_code == 201 and created.get_json()["scopes"] == ["intents", "usage:read"]
    leak_watch.add(created.get_json()["api_key"])


def test_an_operator_sets_any_scopes_and_they_are_audited(client, tenant, admin_headers,
                                                           leak_watch):
    created = client.post(f"/v1/admin/tenants/{tenant.tenant_id}/keys", headers=admin_headers,
                          json={"name": "reporting", "scopes": ["usage:read"]})
    assert created.status_code == 201 and created.get_json()["scopes"] == ["usage:read"]
    reporting = _as(tenant, created.get_json()["api_key"])
    leak_watch.add(reporting.api_key)
    assert_envelope(_generate(client, reporting), 403, "this key lacks the scope intents")
    assert client.get("/v1/tenant/usage/daily", headers=reporting.headers).status_code == 200
    entries = client.get("/v1/tenant/audit-log", headers=reporting.headers).get_json()["entries"]
    assert entries[0]["action"] == "api_key.created"
    assert entries[0]["details"]["scopes"] == ["usage:read"]
    assert entries[0]["actor"] == "admin:ops"
    first = entries[-1]
    assert first["action"] == "tenant.created" and first["details"]["scopes"] == ALL_SCOPES


def test_the_cli_sets_and_lists_scopes(runner, tenant, leak_watch):
    added = runner.invoke(args=["tenants", "keys", "add", str(tenant.tenant_id), "--name",
                                "ci", "--scope", "usage:read", "--scope", "intents"])
    assert added.exit_code == 0, added.output
    leak_watch.add(added.output.split(": ")[1].split()[0])
    assert "scopes intents,usage:read" in added.output
    listed = runner.invoke(args=["tenants", "keys", "list", str(tenant.tenant_id)]).output
    header, *rows = listed.splitlines()
    assert header.split("\t")[3] == "SCOPES"
    assert sorted(row.split("\t")[3] for row in rows) == sorted([",".join(ALL_SCOPES),
                                                                  "intents,usage:read"])
    refused = runner.invoke(args=["tenants", "keys", "add", str(tenant.tenant_id), "--name",
                                  "x", "--scope", "everything"])
    assert refused.exit_code != 0 and "everything" in refused.output


def test_the_payload_scheme_is_an_operators_choice(client, tenant, admin_headers):
    assert_envelope(client.put("/v1/tenant/signature-scheme", headers=tenant.headers,
                               json={"scheme": "payload"}),
                    403, "the payload scheme can only be chosen by an operator")
    chosen = client.put(f"/v1/admin/tenants/{tenant.tenant_id}/signature-scheme",
                        headers=admin_headers, json={"scheme": "payload"})
    assert chosen.status_code == 200 and chosen.get_json()["scheme"] == "payload"
    # A tenant key may still leave it for a scheme that binds the intent.
    moved = client.put("/v1/tenant/signature-scheme", headers=tenant.headers,
                       json={"scheme": "bound"})
    assert moved.status_code == 200 and moved.get_json()["scheme"] == "bound"


# -- signing keys: fingerprints, one entry per key ---------------------------------------------

def _fingerprint(raw_base64):
    digest = hashlib.sha256(base64.b64decode(raw_base64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def test_the_same_public_key_is_registered_once_in_either_form(client, tenant):
    pair = KeyPair()
    added = client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                        json={"public_key": pair.raw_base64})
    assert added.status_code == 201
    key_id = added.get_json()["id"]
    assert added.get_json()["fingerprint"] == _fingerprint(pair.raw_base64)
    for form in (pair.raw_base64, pair.pem):
        body = assert_envelope(client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                                           json={"public_key": form}),
                               409, "this public key is already registered")
        assert key_id in json.dumps(body["details"])
    (listed,) = client.get("/v1/tenant/signing-keys",
                           headers=tenant.headers).get_json()["signing_keys"]
    assert listed["fingerprint"] == _fingerprint(pair.raw_base64)
    # Revoked, it may be registered again.
    assert client.delete(f"/v1/tenant/signing-keys/{key_id}",
                         headers=tenant.headers).status_code == 200
    assert client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                       json={"public_key": pair.pem}).status_code == 201


def test_concurrent_registrations_of_one_key_make_one_entry(client, tenant):
    pair = KeyPair()

    def register(index):
        form = pair.pem if index % 2 else pair.raw_base64
        return client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                           json={"public_key": form}).status_code

    with ThreadPoolExecutor(max_workers=10) as pool:
        statuses = sorted(pool.map(register, range(10)))
    assert statuses == [201] + [409] * 9
    listed = client.get("/v1/tenant/signing-keys", headers=tenant.headers).get_json()
    assert len(listed["signing_keys"]) == 1


def _noncanonical(signature):
    """The same 64 bytes in base64 with non-zero trailing bits: the last character before
    '==' carries 2 bits of data and 4 that must be zero."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(signature[-3])
    return signature[:-3] + alphabet[last | 0b0101] + "=="


def test_a_signature_in_non_canonical_base64_is_invalid(client, tenant, admin_headers):
    pair = KeyPair()
    assert client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                       json={"public_key": pair.raw_base64}).status_code == 201
    assert client.put("/v1/tenant/signature-scheme", headers=tenant.headers,
                      json={"scheme": "ed25519"}).status_code == 200
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    response = pair.response(intent_hash)
    bent = _noncanonical(response["signature"])
    assert bent != response["signature"]
    assert base64.b64decode(bent) == base64.b64decode(response["signature"])
    verdict = _verify(client, tenant, intent_hash, {**response, "signature": bent}).get_json()
    assert verdict["reason"] == "InvalidSignature"
    intent_hash = _generate(client, tenant).get_json()["intent_hash"]
    assert _verify(client, tenant, intent_hash,
                   pair.response(intent_hash)).get_json()["cleared"] is True


# -- the payload as signed ---------------------------------------------------------------------

def _verify_as_sent(client, tenant, signed, sent, idempotency_key=None, intent_hash=None,
                    timestamp=None):
    """Verify a response signed over `signed` whose body spells the payload as `sent`."""
    intent_hash = intent_hash or _generate(client, tenant).get_json()["intent_hash"]
    response = scale_response(tenant.signing_secret, intent_hash, payload=signed,
                              match_id="as-sent-" + intent_hash[-12:], timestamp=timestamp)
    body = json.dumps({"original_intent_hash": intent_hash, "response": response})
    headers = {**tenant.headers, "Content-Type": "application/json"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    answer = client.post("/v1/intent/verify", headers=headers,
                         data=body.replace(json.dumps(signed), sent))
    assert answer.status_code == 200 and answer.get_json()["cleared"] is True
    return intent_hash, answer.get_data(as_text=True)


@pytest.mark.parametrize("signed, sent, returned", [
    ({"n": 0}, '{"n": -0.0}', '"payload":{"n":0}'),
    ({"n": 1}, '{"n": 1.0}', '"payload":{"n":1}'),
    ({"n": [1.5, 100]}, '{"n": [1.50, 1e2]}', '"payload":{"n":[1.5,100]}'),
    # Numbers JCS spells otherwise than Python's float repr (1e+16, 1e-06, 1e-07, 1e+20).
    ({"n": 1e16}, '{"n": 1e16}', '"payload":{"n":10000000000000000}'),
    ({"n": [1e-6, 1e-7, 1.5e-5]}, '{"n": [1e-6, 1E-7, 0.000015]}',
     '"payload":{"n":[0.000001,1e-7,0.000015]}'),
    ({"n": 1e20}, '{"n": 1e20}', '"payload":{"n":100000000000000000000}'),
    ({"n": 9007199254740992.0}, '{"n": 9007199254740993.0}', '"payload":{"n":9007199254740992}'),
])
def test_a_cleared_payload_comes_back_as_it_was_signed(client, tenant, signed, sent, returned):
    _, text = _verify_as_sent(client, tenant, signed, sent)
    assert returned in text.replace(" ", "")
    # A retry's stored verdict rebuilds the payload from the body: the same form. The retry is
    # the same body, signed at the same second (a new second would be a different request).
    signed_at = int(time.time())
    intent_hash, text = _verify_as_sent(client, tenant, signed, sent, idempotency_key="once",
                                        timestamp=signed_at)
    assert returned in text.replace(" ", "")
    _, text = _verify_as_sent(client, tenant, signed, sent, idempotency_key="once",
                              intent_hash=intent_hash, timestamp=signed_at)
    assert returned in text.replace(" ", "")


# -- every operation, from the OpenAPI document --------------------------------------------------

def _operations(client):
    document = client.get("/openapi.json").get_json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if path.startswith("/v1/"):
                yield path, method, operation


def test_every_v1_operation_declares_its_scope(client):
    """The scope is declared where the view's authentication is (app.auth): the document
    shows it for every operation, so none can have been forgotten."""
    operations = list(_operations(client))
    assert len(operations) > 20
    for path, method, operation in operations:
        assert "x-scope" in operation, f"{method.upper()} {path} declares no scope"
        assert operation["x-scope"] in ALL_SCOPES + [None]
    scoped = {(path, method): operation["x-scope"] for path, method, operation in operations}
    assert scoped[("/v1/intent/verify", "post")] == "intents"
    assert scoped[("/v1/tenant/usage", "get")] is None
    assert scoped[("/v1/tenant/signing-secret/rotate", "post")] == "signing:write"
    assert scoped[("/v1/admin/tenants/{tenant_id}/signing-secret/rotate", "post")] == \
        "signing:write"


def _call(client, path, method, api_key):
    path = path.replace("{key_id}", "ak_000000000000000000000000")
    kwargs = {"json": {}} if method in ("post", "put", "patch") else {}
    return getattr(client, method)(path, headers={"X-Service-Key": api_key}, **kwargs)


def test_each_operation_refuses_a_key_without_its_scope_and_takes_one_with_only_it(
        client, tenant, leak_watch):
    """For every operation a tenant key may call: a key holding every other scope is refused
    with the scope's text; a key holding that scope alone is not refused for a scope."""
    by_scope = {}
    for path, method, operation in _operations(client):
        if operation["x-scope"] is not None and not path.startswith("/v1/admin/"):
            by_scope.setdefault(operation["x-scope"], []).append((path, method))
    assert set(by_scope) >= {"intents", "usage:read", "keys:write", "signing:write"}
    for scope, operations in by_scope.items():
        only = _scoped(client, tenant, leak_watch, [scope])
        others = _scoped(client, tenant, leak_watch,
                         [other for other in ALL_SCOPES if other != scope])
        for path, method in operations:
            assert_envelope(_call(client, path, method, others.api_key), 403,
                            f"this key lacks the scope {scope}")
            allowed = _call(client, path, method, only.api_key)
            assert allowed.status_code != 403 or "scope" not in allowed.get_json()["error"], \
                f"{method.upper()} {path}: {allowed.get_data(as_text=True)}"
        for key in (only, others):  # at most 10 active keys: make room for the next scope
            key_id = next(listed["id"] for listed in client.get(
                "/v1/tenant/keys", headers=tenant.headers).get_json()["keys"]
                if key.api_key.startswith(listed["prefix"]))
            assert client.delete(f"/v1/tenant/keys/{key_id}",
                                 headers=tenant.headers).status_code == 200
