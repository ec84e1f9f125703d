"""The SDK's RFC 8785 form agrees with the shared canonicalization vectors, as Node's does."""
import json
from pathlib import Path

import pytest

from intentgate.signing import NonFiniteNumber, UnsignablePayload, canonical_json

CANONICALIZATION = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "canonicalization.json")
    .read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", CANONICALIZATION["vectors"], ids=lambda v: v["name"])
def test_canonical_form(vector):
    assert canonical_json(vector["value"]) == vector["canonical"].encode("utf-8")


@pytest.mark.parametrize("case", CANONICALIZATION["refused"], ids=lambda case: case["name"])
def test_values_without_a_canonical_form_are_refused(case):
    refusal = NonFiniteNumber if case["reason"] == "non-finite number" else UnsignablePayload
    with pytest.raises(refusal):
        canonical_json(case["value"])


def test_the_vectors_file_holds_the_hard_numbers_as_numbers():
    """-0, 5e-324 and 1e21 must reach the canonicalizer as numbers, not as strings."""
    values = {vector["name"]: vector["value"] for vector in CANONICALIZATION["vectors"]}
    assert values["-0.0"] == 0.0 and str(values["-0.0"]) == "-0.0"
    assert values["5e-324: smallest positive double (subnormal)"] == 5e-324 > 0
    assert values["1e21: the first double written with an exponent"] == 1e21
