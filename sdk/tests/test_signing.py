"""The SDK signer agrees byte for byte with the server's test vectors."""
import json
from pathlib import Path

import pytest

from intentgate import ScaleResponse, sign_response, signing_message

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
