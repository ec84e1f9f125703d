"""The SDK signer agrees byte for byte with the server's test vectors."""
import json
from pathlib import Path

import pytest

from intentgate import ScaleResponse, sign_response, signing_message
from intentgate.signing import (
    IntegerOutOfRange,
    NonFiniteNumber,
    UnsignablePayload,
    canonical_json,
)

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "signatures.json").read_text()
)["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: f"{v['scheme']}-{v['match_id']}")
def test_vectors(vector):
    args = (vector["intent_hash"], vector["match_id"], vector["timestamp"], vector["payload"])
    assert signing_message(*args, scheme=vector["scheme"]).decode("utf-8") == vector["message"]
    assert sign_response(vector["secret"], *args, scheme=vector["scheme"]) == vector["signature"]


def test_scale_response_sign_fills_match_id_and_timestamp():
    vector = VECTORS[0]
    signed = ScaleResponse.sign(vector["secret"], vector["intent_hash"], vector["payload"],
                                match_id=vector["match_id"], timestamp=vector["timestamp"])
    assert signed.signature == vector["signature"]
    fresh = ScaleResponse.sign(vector["secret"], vector["intent_hash"], {"a": 1})
    assert len(fresh.match_id) == 32 and fresh.timestamp > 1_700_000_000
    assert set(fresh.to_dict()) == {"match_id", "payload", "timestamp", "signature"}


def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError):
        signing_message("sha256:" + "a" * 64, "m", 1, {}, scheme="other")


UNSIGNABLE = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "signatures.json").read_text()
)["unsignable"]


@pytest.mark.parametrize("case", UNSIGNABLE, ids=lambda case: json.dumps(case["payload"]))
def test_integers_beyond_the_safe_range_are_refused_not_rounded(case):
    for scheme in ("bound", "payload"):
        with pytest.raises(IntegerOutOfRange) as refused:
            sign_response(VECTORS[0]["secret"], VECTORS[0]["intent_hash"], "m", 1,
                          case["payload"], scheme=scheme)
        assert str(refused.value) == case["error"]
    with pytest.raises(UnsignablePayload):
        ScaleResponse.sign(VECTORS[0]["secret"], VECTORS[0]["intent_hash"], case["payload"])


def test_integers_past_pythons_digit_limit_are_refused_the_same_way():
    with pytest.raises(IntegerOutOfRange):
        canonical_json({"n": -(10**5000)})


@pytest.mark.parametrize("payload, refusal", [
    ({"x": float("inf")}, NonFiniteNumber),
    ({"x": [float("nan")]}, NonFiniteNumber),
    ({"x": "\ud800"}, UnsignablePayload),
    ({"\udfff": 1}, UnsignablePayload),
    ({1: "key is not a string"}, UnsignablePayload),
])
def test_other_payloads_without_an_exact_canonical_form_are_refused(payload, refusal):
    with pytest.raises(refusal):
        canonical_json(payload)


def test_the_edges_of_the_safe_range_sign():
    assert canonical_json({"a": 2**53 - 1, "b": -(2**53 - 1)}) == (
        b'{"a":9007199254740991,"b":-9007199254740991}')


SECRET, HASH = VECTORS[0]["secret"], VECTORS[0]["intent_hash"]


@pytest.mark.parametrize("arguments, refusal, text", [
    ((None, HASH, "m", 1, {}), TypeError, "secret must be the signing secret string"),
    (("", HASH, "m", 1, {}), ValueError, "secret must not be empty"),
    (("sig_live_\ud800", HASH, "m", 1, {}), ValueError, "secret must be valid Unicode"),
    ((SECRET, None, "m", 1, {}), TypeError, "intent_hash must be a string"),
    ((SECRET, HASH, "", 1, {}), ValueError, "match_id must not be empty"),
    ((SECRET, HASH, "m", 1.5, {}), TypeError, "timestamp must be an integer"),
    ((SECRET, HASH, "m", "1", {}), TypeError, "timestamp must be an integer"),
    ((SECRET, HASH, "m", True, {}), TypeError, "timestamp must be an integer"),
    ((SECRET, HASH, "m", 2**53, {}), ValueError, "timestamp must be Unix seconds within"),
    ((SECRET, HASH, "m", 1, ["a list"]), TypeError, "payload must be a JSON object"),
    ((SECRET, HASH, "m", 1, None), TypeError, "payload must be a JSON object"),
])
def test_what_the_service_would_refuse_is_not_signed(arguments, refusal, text):
    with pytest.raises(refusal, match=text):
        sign_response(*arguments)


def test_scale_response_refuses_an_empty_match_id_rather_than_making_one_up():
    """None fills in a fresh id; an empty one given is refused, as sign_response refuses it."""
    with pytest.raises(ValueError, match="match_id must not be empty"):
        ScaleResponse.sign(SECRET, HASH, {}, match_id="")
    assert ScaleResponse.sign(SECRET, HASH, {}, match_id=None).match_id
