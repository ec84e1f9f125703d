"""The ed25519 scheme: public keys per tenant, verification with any active key, and moving
between schemes without downtime (CONTRACT.md, Verify; Tenant self-service)."""
import base64
import json
import time
import uuid

import pytest
import rfc8785
import time_machine
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa, x25519

from tests.support import assert_envelope, scale_response

T0 = 1_800_000_000


class KeyPair:
    """An AI service's Ed25519 key pair, signing as CONTRACT.md says (written apart from app
    code: the bound message, standard base64 of the 64-byte signature)."""

    def __init__(self):
        self.private_key = ed25519.Ed25519PrivateKey.generate()
        public = self.private_key.public_key()
        self.raw_base64 = base64.b64encode(public.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
        self.pem = public.public_bytes(serialization.Encoding.PEM,
                                       serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        self.private_pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode()

    def response(self, intent_hash, payload=None, match_id=None, timestamp=None):
        payload = {"answer": "42"} if payload is None else payload
        match_id = match_id or uuid.uuid4().hex
        timestamp = int(time.time()) if timestamp is None else timestamp
        message = f"{intent_hash}.{match_id}.{timestamp}.".encode() + rfc8785.dumps(payload)
        signature = base64.b64encode(self.private_key.sign(message)).decode()
        return {"match_id": match_id, "payload": payload, "timestamp": timestamp,
                "signature": signature}


def _generate(client, tenant):
    return client.post("/v1/intent/generate", headers=tenant.headers,
                       json={"user_token": "ed25519-user-token"}).get_json()["intent_hash"]


def _verify(client, tenant, intent_hash, response):
    answer = client.post("/v1/intent/verify", headers=tenant.headers,
                         json={"original_intent_hash": intent_hash, "response": response})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return answer.get_json()


def _add_key(client, tenant, public_key, **fields):
    return client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                       json={"public_key": public_key, **fields})


def _set_scheme(client, tenant, scheme, grace_seconds=None):
    body = {"scheme": scheme} if grace_seconds is None else {"scheme": scheme,
                                                              "grace_seconds": grace_seconds}
    return client.put("/v1/tenant/signature-scheme", headers=tenant.headers, json=body)


@pytest.fixture
def on_ed25519(client, tenant):
    pair = KeyPair()
    assert _add_key(client, tenant, pair.raw_base64).status_code == 201
    assert _set_scheme(client, tenant, "ed25519").status_code == 200
    return pair


def test_a_response_signed_with_a_registered_key_clears(client, tenant, on_ed25519):
    intent_hash = _generate(client, tenant)
    result = _verify(client, tenant, intent_hash, on_ed25519.response(intent_hash, {"n": 1}))
    assert result == {"cleared": True, "reason": None, "payload": {"n": 1}}


def test_every_registered_key_verifies_and_pem_is_accepted(client, tenant, on_ed25519):
    second = KeyPair()
    created = _add_key(client, tenant, second.pem, name="second")
    assert created.status_code == 201
    body = created.get_json()
    assert body["name"] == "second" and body["id"].startswith("sk_")
    assert body["expires_at"] is None and isinstance(body["created_at"], int)
    for pair in (on_ed25519, second):
        intent_hash = _generate(client, tenant)
        assert _verify(client, tenant, intent_hash, pair.response(intent_hash))["cleared"]


def test_key_pair_rollover_end_to_end(client, tenant, on_ed25519):
    old, new = on_ed25519, KeyPair()
    new_id = _add_key(client, tenant, new.raw_base64, name="next").get_json()["id"]
    listed = client.get("/v1/tenant/signing-keys", headers=tenant.headers).get_json()
    assert sorted(key["id"] for key in listed["signing_keys"]) == sorted(
        [new_id, next(key["id"] for key in listed["signing_keys"] if key["name"] is None)])
    old_id = next(key["id"] for key in listed["signing_keys"] if key["id"] != new_id)
    # The AI service switches to the new private key; then the old public key is revoked.
    intent_hash = _generate(client, tenant)
    assert _verify(client, tenant, intent_hash, new.response(intent_hash))["cleared"]
    revoked = client.delete(f"/v1/tenant/signing-keys/{old_id}", headers=tenant.headers)
    assert revoked.status_code == 200 and revoked.get_json()["revoked_at"] is not None
    intent_hash = _generate(client, tenant)
    assert _verify(client, tenant, intent_hash,
                   old.response(intent_hash))["reason"] == "InvalidSignature"
    listed = client.get("/v1/tenant/signing-keys", headers=tenant.headers).get_json()
    assert [key["id"] for key in listed["signing_keys"]] == [new_id]


def test_an_expired_key_stops_verifying(client, tenant):
    pair = KeyPair()
    with time_machine.travel(T0, tick=False):
        created = _add_key(client, tenant, pair.raw_base64, expires_in=60).get_json()
        assert created["expires_at"] == T0 + 60
        assert _set_scheme(client, tenant, "ed25519").status_code == 200
        early = _generate(client, tenant)
        late = _generate(client, tenant)
        assert _verify(client, tenant, early, pair.response(early))["cleared"]
    with time_machine.travel(T0 + 61, tick=False):
        result = _verify(client, tenant, late, pair.response(late, timestamp=T0 + 61))
        assert result["reason"] == "InvalidSignature"
        assert client.get("/v1/tenant/signing-keys",
                          headers=tenant.headers).get_json() == {"signing_keys": []}


@pytest.mark.parametrize("tamper", [
    lambda r: r["payload"].update(answer="43"),
    lambda r: r.update(match_id=r["match_id"] + "x"),
    lambda r: r.update(timestamp=r["timestamp"] - 1),
    lambda r: r.update(signature=r["signature"][:-4] + "AAA="),
    lambda r: r.update(signature="not base64 at all"),
    lambda r: r.update(signature=base64.b64encode(b"\0" * 63).decode()),
    lambda r: r.update(signature="ab" * 32),  # an HMAC-looking hex signature
])
def test_tampering_is_an_invalid_signature(client, tenant, on_ed25519, tamper):
    intent_hash = _generate(client, tenant)
    response = on_ed25519.response(intent_hash)
    tamper(response)
    assert _verify(client, tenant, intent_hash, response)["reason"] == "InvalidSignature"


def test_a_signature_made_for_another_intent_is_invalid(client, tenant, on_ed25519):
    first, second = _generate(client, tenant), _generate(client, tenant)
    response = on_ed25519.response(first)
    assert _verify(client, tenant, second, response)["reason"] == "InvalidSignature"


def test_another_tenants_key_does_not_verify(client, tenant, make_tenant, on_ed25519):
    other = make_tenant("pro")
    other_pair = KeyPair()
    _add_key(client, other, other_pair.raw_base64)
    intent_hash = _generate(client, tenant)
    assert _verify(client, tenant, intent_hash,
                   other_pair.response(intent_hash))["reason"] == "InvalidSignature"


def _pem(public_key):
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()


BAD_PUBLIC_KEYS = {
    "rsa": (lambda: _pem(rsa.generate_private_key(65537, 2048).public_key()), "is an RSA key"),
    "p256": (lambda: _pem(ec.generate_private_key(ec.SECP256R1()).public_key()),
             "is an ECDSA key"),
    "x25519": (lambda: _pem(x25519.X25519PrivateKey.generate().public_key()),
               "is an X25519 key"),
    "garbage": (lambda: "hello, world", "must be an Ed25519 public key"),
    "short": (lambda: base64.b64encode(b"k" * 31).decode(), "must be an Ed25519 public key"),
    "broken pem": (lambda: "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----",
                   "must be an Ed25519 public key"),
    "pem and more": (lambda: KeyPair().pem + "trailing text", "must be an Ed25519 public key"),
    "two pems": (lambda: KeyPair().pem + KeyPair().pem, "must be an Ed25519 public key"),
    "pem headers": (lambda: KeyPair().pem.replace(
        "-----\n", "-----\nProc-Type: 4,ENCRYPTED\n\n", 1), "must be an Ed25519 public key"),
}


@pytest.mark.parametrize("kind", sorted(BAD_PUBLIC_KEYS))
def test_other_keys_and_garbage_are_400(client, tenant, kind):
    make, text = BAD_PUBLIC_KEYS[kind]
    body = assert_envelope(_add_key(client, tenant, make()), 400)
    assert text in body["error"]


# The eight points of small order (RFC 8032 does not refuse them; each verifies forged
# signatures): the identity, (0, -1), the two of order 4 and the four of order 8.
SMALL_ORDER_POINTS = [bytes.fromhex(point) for point in (
    "0100000000000000000000000000000000000000000000000000000000000000",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
)]
# The identity as a point: R = identity and s = 0 verify any message under it.
FORGED_SIGNATURE = base64.b64encode(SMALL_ORDER_POINTS[0] + bytes(32)).decode()


def _mixed_order_point():
    """A real public key plus a point of order 8: outside the prime-order subgroup."""
    from nacl.bindings import crypto_core_ed25519_add  # pylint: disable=import-outside-toplevel
    return crypto_core_ed25519_add(base64.b64decode(KeyPair().raw_base64),
                                   SMALL_ORDER_POINTS[4])


def test_points_of_small_order_are_refused_so_nothing_verifies_a_forgery(client, tenant):
    weak = SMALL_ORDER_POINTS + [_mixed_order_point()]
    for raw in weak:
        for form in (base64.b64encode(raw).decode(),
                     _pem(ed25519.Ed25519PublicKey.from_public_bytes(raw))):
            assert_envelope(_add_key(client, tenant, form), 400,
                            "public_key is not usable: it is a point of small order or outside "
                            "the prime-order subgroup, with which anyone could forge signatures")
    assert client.get("/v1/tenant/signing-keys", headers=tenant.headers).get_json() == {
        "signing_keys": []}
    assert_envelope(_set_scheme(client, tenant, "ed25519"), 409,
                    "the ed25519 scheme needs an active signing key: add one first")


def test_a_forged_signature_does_not_clear(client, tenant, on_ed25519):
    intent_hash = _generate(client, tenant)
    forged = {**on_ed25519.response(intent_hash), "signature": FORGED_SIGNATURE}
    assert _verify(client, tenant, intent_hash, forged)["reason"] == "InvalidSignature"


def _private_forms():
    key = ed25519.Ed25519PrivateKey.generate()
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode()
    openssh = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw,
                                           serialization.PublicFormat.Raw)
    sodium = base64.b64encode(raw + public).decode()  # libsodium's 64-byte secret key
    rsa_pem = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption()).decode()
    return [pkcs8, openssh, sodium, rsa_pem]


def test_a_private_key_is_refused_and_kept_nowhere(client, tenant, leak_watch):
    for private in _private_forms():
        leak_watch.add_private(private)
        body = assert_envelope(_add_key(client, tenant, private), 400)
        assert "private key" in body["error"] and "not stored" in body["error"]
    listed = client.get("/v1/tenant/signing-keys", headers=tenant.headers).get_json()
    assert listed == {"signing_keys": []}
    # The app fixture's leak watch then searches the database dump and every log line.


def test_at_most_five_active_keys(client, tenant):
    ids = [_add_key(client, tenant, KeyPair().raw_base64).get_json()["id"] for _ in range(5)]
    assert_envelope(_add_key(client, tenant, KeyPair().raw_base64), 409,
                    "a tenant holds at most 5 active signing keys: revoke one first")
    client.delete(f"/v1/tenant/signing-keys/{ids[0]}", headers=tenant.headers)
    assert _add_key(client, tenant, KeyPair().raw_base64).status_code == 201


def test_ed25519_needs_a_key_and_keeps_its_last_one(client, tenant):
    assert_envelope(_set_scheme(client, tenant, "ed25519"), 409,
                    "the ed25519 scheme needs an active signing key: add one first")
    key_id = _add_key(client, tenant, KeyPair().raw_base64).get_json()["id"]
    assert _set_scheme(client, tenant, "ed25519").status_code == 200
    assert_envelope(client.delete(f"/v1/tenant/signing-keys/{key_id}", headers=tenant.headers),
                    409, "this is the last active signing key of a tenant on the ed25519 scheme")
    assert_envelope(client.delete("/v1/tenant/signing-keys/sk_unknown", headers=tenant.headers),
                    404, "signing key not found")


@pytest.mark.parametrize("grace", [0, 600])
def test_switching_from_hmac_to_ed25519(client, tenant, grace):
    pair = KeyPair()
    _add_key(client, tenant, pair.raw_base64)
    with time_machine.travel(T0, tick=False):
        hashes = [_generate(client, tenant) for _ in range(3)]
        switched = _set_scheme(client, tenant, "ed25519", grace_seconds=grace)
        expected = {"scheme": "ed25519", "previous_scheme": "bound" if grace else None,
                    "previous_valid_until": T0 + grace if grace else None}
        assert switched.get_json() == expected
        during = _verify(client, tenant, hashes[0], scale_response(tenant.signing_secret,
                                                                   hashes[0]))
        assert during["cleared"] is bool(grace)
        assert _verify(client, tenant, hashes[1], pair.response(hashes[1]))["cleared"]
    with time_machine.travel(T0 + grace + 1, tick=False):
        late = scale_response(tenant.signing_secret, hashes[2], timestamp=T0 + grace + 1)
        assert _verify(client, tenant, hashes[2], late)["reason"] == "InvalidSignature"


@pytest.mark.parametrize("grace", [0, 600])
def test_switching_from_ed25519_back_to_hmac(client, tenant, on_ed25519, grace):
    with time_machine.travel(T0, tick=False):
        hashes = [_generate(client, tenant) for _ in range(3)]
        assert _set_scheme(client, tenant, "bound", grace_seconds=grace).status_code == 200
        during = _verify(client, tenant, hashes[0], on_ed25519.response(hashes[0]))
        assert during["cleared"] is bool(grace)
        assert _verify(client, tenant, hashes[1],
                       scale_response(tenant.signing_secret, hashes[1]))["cleared"]
    with time_machine.travel(T0 + grace + 1, tick=False):
        late = on_ed25519.response(hashes[2], timestamp=T0 + grace + 1)
        assert _verify(client, tenant, hashes[2], late)["reason"] == "InvalidSignature"


def test_the_scheme_in_force_with_no_grace_ends_a_grace_at_once(client, tenant):
    """"0: it stops at once": asked for the scheme already in force, a grace still running
    ends, where the call answered 200 and left it (a weaker scheme went on verifying). With a
    grace, or with no grace running, nothing changes and nothing is audited."""
    pair = KeyPair()
    _add_key(client, tenant, pair.raw_base64)
    with time_machine.travel(T0, tick=False):
        hashes = [_generate(client, tenant) for _ in range(2)]
        assert _set_scheme(client, tenant, "ed25519", grace_seconds=600).status_code == 200
        kept = _set_scheme(client, tenant, "ed25519", grace_seconds=60).get_json()
        assert kept == {"scheme": "ed25519", "previous_scheme": "bound",
                        "previous_valid_until": T0 + 600}
        ended = _set_scheme(client, tenant, "ed25519", grace_seconds=0).get_json()
        assert ended == {"scheme": "ed25519", "previous_scheme": None,
                         "previous_valid_until": None}
        hmac_signed = scale_response(tenant.signing_secret, hashes[0])
        assert _verify(client, tenant, hashes[0], hmac_signed)["reason"] == "InvalidSignature"
        assert _verify(client, tenant, hashes[1], pair.response(hashes[1]))["cleared"]
        assert _set_scheme(client, tenant, "ed25519").status_code == 200  # nothing to end
        answer = client.get("/v1/tenant/audit-log", headers=tenant.headers)
    assert answer.status_code == 200, answer.get_json()
    entries = answer.get_json()["entries"]
    changes = [entry["details"] for entry in entries
               if entry["action"] == "signature_scheme.changed"]
    assert changes == [{"old": "ed25519", "new": "ed25519", "grace_seconds": 0,
                        "grace_ended": "bound"},
                       {"old": "bound", "new": "ed25519", "grace_seconds": 600}]


def test_bad_scheme_requests_are_400(client, tenant):
    for body, error in [({"scheme": "rsa"}, "scheme must be one of: bound, payload, ed25519"),
                        ({}, "scheme is required"),
                        ({"scheme": "bound", "grace_seconds": -1},
                         "grace_seconds must be an integer between 0 and 604800"),
                        ({"scheme": "bound", "grace_seconds": True},
                         "grace_seconds must be an integer between 0 and 604800")]:
        assert_envelope(client.put("/v1/tenant/signature-scheme", headers=tenant.headers,
                                   json=body), 400, error)


def test_the_signing_secret_rotates_with_a_grace_and_is_never_cached(client, tenant, leak_watch):
    with time_machine.travel(T0, tick=False):
        rotated = client.post("/v1/tenant/signing-secret/rotate", headers=tenant.headers,
                              json={"grace_seconds": 300})
        assert rotated.status_code == 200 and rotated.headers["Cache-Control"] == "no-store"
        body = rotated.get_json()
        leak_watch.add(body["signing_secret"])
        assert body["signing_secret"].startswith("sig_live_")
        assert body["previous_valid_until"] == T0 + 300
        for secret in (tenant.signing_secret, body["signing_secret"]):
            intent_hash = _generate(client, tenant)
            assert _verify(client, tenant, intent_hash,
                           scale_response(secret, intent_hash))["cleared"]


def test_admin_keys_manage_any_tenant_with_the_same_operations(client, runner, tenant):
    admin = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "ops",
                                           "--json"]).stdout)
    headers = {"X-Service-Key": admin["api_key"]}
    base = f"/v1/admin/tenants/{tenant.tenant_id}"
    pair = KeyPair()
    created = client.post(f"{base}/signing-keys", headers=headers,
                          json={"public_key": pair.pem, "name": "by admin"})
    assert created.status_code == 201
    assert client.put(f"{base}/signature-scheme", headers=headers,
                      json={"scheme": "ed25519"}).get_json()["scheme"] == "ed25519"
    intent_hash = _generate(client, tenant)
    assert _verify(client, tenant, intent_hash, pair.response(intent_hash))["cleared"]
    listed = client.get(f"{base}/signing-keys", headers=headers).get_json()["signing_keys"]
    assert [key["name"] for key in listed] == ["by admin"]
    assert_envelope(client.get("/v1/admin/tenants/999999/signing-keys", headers=headers), 404,
                    "tenant not found")
    # A tenant key cannot reach another tenant through the admin API.
    assert client.get(f"{base}/signing-keys", headers=tenant.headers).status_code == 403


def test_the_cli_manages_keys_and_switches_with_a_grace(client, runner, tenant, tmp_path):
    pair = KeyPair()
    key_file = tmp_path / "ai-service.pub"
    key_file.write_text(pair.pem)
    added = runner.invoke(args=["tenants", "signing-keys", "add", tenant.email, str(key_file),
                                "--name", "cli"])
    assert added.exit_code == 0, added.output
    key_id = json.loads(added.stdout)["id"]
    listed = runner.invoke(args=["tenants", "signing-keys", "list", str(tenant.tenant_id)])
    assert listed.stdout.splitlines()[0] == "ID\tNAME\tFINGERPRINT\tCREATED_AT\tEXPIRES_AT"
    assert listed.stdout.splitlines()[1].startswith(f"{key_id}\tcli\t")
    switched = runner.invoke(args=["tenants", "set-signature-scheme", tenant.email, "ed25519",
                                   "--grace", "120"])
    assert switched.exit_code == 0, switched.output
    assert json.loads(switched.stdout)["previous_scheme"] == "bound"
    intent_hash = _generate(client, tenant)
    assert _verify(client, tenant, intent_hash, pair.response(intent_hash))["cleared"]
    refused = runner.invoke(args=["tenants", "signing-keys", "revoke", tenant.email, key_id])
    assert refused.exit_code == 1
    assert "last active signing key" in refused.output
    private_file = tmp_path / "ai-service.key"
    private_file.write_text(pair.private_pem)
    leaked = runner.invoke(args=["tenants", "signing-keys", "add", tenant.email,
                                 str(private_file)])
    assert leaked.exit_code == 1 and "private key" in leaked.output
    assert pair.private_pem.splitlines()[1] not in leaked.output
