"""Ed25519 response signatures: the SDK signs every shared vector byte for byte, and a private
key that cannot sign is refused with a clear error that never holds the key."""
import base64
import json
import traceback
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519

from intentgate import (
    Ed25519KeyPair,
    InvalidSigningKey,
    ScaleResponse,
    UnsignablePayload,
    generate_ed25519_key_pair,
    sign_response_ed25519,
    signing_message,
)

ED25519 = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "ed25519.json")
    .read_text(encoding="utf-8"))
KEYS = {key["id"]: key for key in ED25519["keys"]}
VECTORS = ED25519["vectors"]
PEM = serialization.Encoding.PEM


def _pem_body(pem):
    """The base64 lines of a PEM: what must never appear in an error or a log line."""
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


def _private_pem(key, password=None):
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, encryption).decode("ascii")


def _public_pem(key):
    return key.public_bytes(PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: f"{v['key']}-{v['match_id']}")
def test_vectors(vector):
    pem = KEYS[vector["key"]]["private_key_pem"]
    args = (vector["intent_hash"], vector["match_id"], vector["timestamp"], vector["payload"])
    assert signing_message(*args).decode("utf-8") == vector["message"]
    key_object = serialization.load_pem_private_key(pem.encode("ascii"), password=None)
    for private_key in (pem, pem.encode("ascii"), key_object):
        signature = sign_response_ed25519(private_key, *args)
        assert signature == vector["signature"]
    assert len(signature) == 88 and len(base64.b64decode(signature, validate=True)) == 64


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: f"{v['key']}-{v['match_id']}")
def test_vectors_verify_with_both_public_key_forms(vector):
    key = KEYS[vector["key"]]
    raw = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(key["public_key"]))
    spki = serialization.load_pem_public_key(key["public_key_pem"].encode("ascii"))
    for public_key in (raw, spki):
        public_key.verify(base64.b64decode(vector["signature"]), vector["message"].encode("utf-8"))


@pytest.mark.parametrize("key", ED25519["keys"], ids=lambda key: key["id"])
def test_vector_keys_are_one_pair_in_each_form(key):
    private_key = serialization.load_pem_private_key(key["private_key_pem"].encode(), None)
    assert key["private_key_pem"].startswith("-----BEGIN PRIVATE KEY-----\n")  # PKCS#8
    public_key = private_key.public_key()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert base64.b64encode(raw).decode() == key["public_key"]
    assert _public_pem(public_key) == key["public_key_pem"]


def test_one_message_signed_by_two_keys_differs():
    by_message = {}
    for vector in VECTORS:
        by_message.setdefault(vector["message"], set()).add((vector["key"], vector["signature"]))
    rolled = [signed for signed in by_message.values() if len(signed) == 2]
    assert rolled and all(len({signature for _, signature in signed}) == 2 for signed in rolled)


def test_scale_response_sign_ed25519_fills_match_id_and_timestamp():
    vector = VECTORS[0]
    pem = KEYS[vector["key"]]["private_key_pem"]
    signed = ScaleResponse.sign_ed25519(pem, vector["intent_hash"], vector["payload"],
                                        match_id=vector["match_id"],
                                        timestamp=vector["timestamp"])
    assert signed == ScaleResponse(vector["match_id"], vector["payload"], vector["timestamp"],
                                   vector["signature"])
    fresh = ScaleResponse.sign_ed25519(pem, vector["intent_hash"], {"a": 1})
    assert len(fresh.match_id) == 32 and fresh.timestamp > 1_700_000_000
    assert set(fresh.to_dict()) == {"match_id", "payload", "timestamp", "signature"}


def test_generated_key_pair_signs_and_its_public_key_verifies():
    pair = generate_ed25519_key_pair()
    private_pem, public_key = pair
    assert isinstance(pair, Ed25519KeyPair) and private_pem == pair.private_key_pem
    assert private_pem.startswith("-----BEGIN PRIVATE KEY-----\n")
    raw = base64.b64decode(public_key, validate=True)
    assert len(raw) == 32 and len(public_key) == 44
    assert serialization.load_pem_public_key(pair.public_key_pem.encode()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw
    message = signing_message("sha256:" + "a" * 64, "m", 1, {"a": 1})
    signature = sign_response_ed25519(private_pem, "sha256:" + "a" * 64, "m", 1, {"a": 1})
    ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(base64.b64decode(signature), message)
    assert generate_ed25519_key_pair().public_key != public_key


def test_key_pair_repr_leaves_the_private_key_out():
    pair = generate_ed25519_key_pair()
    for text in (repr(pair), str(pair), f"{pair}"):
        assert _pem_body(pair.private_key_pem) not in text and "PRIVATE" not in text
        assert pair.public_key in text


@pytest.fixture(scope="module")
def other_keys():
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ed448_key = ed448.Ed448PrivateKey.generate()
    x25519_key = x25519.X25519PrivateKey.generate()
    ed25519_key = ed25519.Ed25519PrivateKey.generate()
    return {
        "rsa_pem": _private_pem(rsa_key),
        "rsa_pkcs1_pem": rsa_key.private_bytes(PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                               serialization.NoEncryption()).decode(),
        "ec_pem": _private_pem(ec_key),
        "ed448_pem": _private_pem(ed448_key),
        "x25519_pem": _private_pem(x25519_key),
        "encrypted_pem": _private_pem(ed25519_key, password=b"correct horse"),
        "ed25519_public_pem": _public_pem(ed25519_key.public_key()),
        "rsa_object": rsa_key,
        "ec_object": ec_key,
        "public_object": ed25519_key.public_key(),
    }


VECTOR_PEM = KEYS["test-key-1"]["private_key_pem"]
BAD_KEYS = [
    ("rsa_pem", InvalidSigningKey, "RSA"),
    ("rsa_pkcs1_pem", InvalidSigningKey, "RSA"),
    ("ec_pem", InvalidSigningKey, "elliptic-curve"),
    ("ed448_pem", InvalidSigningKey, "Ed448"),
    ("x25519_pem", InvalidSigningKey, "X25519"),
    ("encrypted_pem", InvalidSigningKey, "encrypted"),
    ("ed25519_public_pem", InvalidSigningKey, "public key"),
    ("rsa_object", TypeError, "RSA"),
    ("ec_object", TypeError, "elliptic-curve"),
    ("public_object", TypeError, "public key"),
]


@pytest.mark.parametrize("name, refusal, named", BAD_KEYS, ids=[case[0] for case in BAD_KEYS])
def test_keys_that_cannot_sign_ed25519_are_refused_by_kind(other_keys, name, refusal, named):
    with pytest.raises(refusal) as refused:
        sign_response_ed25519(other_keys[name], "sha256:" + "a" * 64, "m", 1, {})
    assert named in str(refused.value)
    _assert_no_key_material(refused, other_keys[name])


@pytest.mark.parametrize("private_key, refusal", [
    (KEYS["test-key-1"]["public_key"], InvalidSigningKey),   # base64 of the raw public key
    ("not a key", InvalidSigningKey),
    ("", InvalidSigningKey),
    (VECTOR_PEM.replace("MC4C", "MC5C"), InvalidSigningKey),  # a damaged PKCS#8 structure
    (VECTOR_PEM[:60], InvalidSigningKey),                      # truncated
    (VECTOR_PEM.replace("\n-----END", "\u00e9\n-----END"), InvalidSigningKey),
    (None, TypeError),
    (42, TypeError),
    ({"pem": VECTOR_PEM}, TypeError),
], ids=["raw-public-base64", "garbage", "empty", "damaged", "truncated", "non-ascii", "none",
        "int", "dict"])
def test_anything_else_is_a_clear_error_without_the_key(private_key, refusal):
    with pytest.raises(refusal) as refused:
        sign_response_ed25519(private_key, "sha256:" + "a" * 64, "m", 1, {})
    assert "Ed25519" in str(refused.value) or "PEM" in str(refused.value)
    _assert_no_key_material(refused, private_key if isinstance(private_key, str) else VECTOR_PEM)


def test_an_unsignable_payload_is_refused_as_with_hmac():
    with pytest.raises(UnsignablePayload):
        sign_response_ed25519(VECTOR_PEM, "sha256:" + "a" * 64, "m", 1, {"n": 2**53})


def _assert_no_key_material(refused, key):
    """Neither the error nor the traceback a logger would print holds the key's bytes."""
    printed = "".join(traceback.format_exception(refused.type, refused.value, refused.tb))
    secrets = [VECTOR_PEM, _pem_body(VECTOR_PEM)]
    if isinstance(key, str) and "PRIVATE KEY" in key:
        secrets.append(_pem_body(key))
    for secret in secrets:
        assert secret not in str(refused.value) and secret not in printed
