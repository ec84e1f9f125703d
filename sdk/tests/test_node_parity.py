"""The Node signer (sdk/js) and the Python signer make the same bytes for the same payloads:
several hundred seeded random payloads (random IEEE doubles, control and non-BMP characters,
keys that sort differently by code point and by UTF-16 unit) signed by both."""
import json
import math
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from intentgate.signing import canonical_json, sign_response, sign_response_ed25519

JS_PACKAGE = Path(__file__).resolve().parents[1] / "js"
ED25519 = json.loads((Path(__file__).resolve().parents[2] / "tests" / "vectors" / "ed25519.json")
                     .read_text(encoding="utf-8"))
PRIVATE_KEY = ED25519["keys"][0]["private_key_pem"]
SECRET = "sig_live_" + "5a" * 32
CHARACTERS = (list("abcAZ09 _-./\\\"'") + [chr(c) for c in range(0x20)]
              + ["\u007f", "\u0080", "\u00e9", "\u2028", "\u20ac", "\ufb33", "\uffff", "\u4e2d",
                 "\U0001f600", "\U0001d11e", "\U0010ffff"])
NODE_SIGNER = r"""
const { canonicalize, signResponse, signResponseEd25519 } = require('./index.js');
const { secret, privateKey, cases } = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const attempt = (sign) => {
  try { return sign(); } catch (error) { return `${error.name}: ${error.message}`; }
};
const results = cases.map(({ intent_hash: hash, match_id: id, timestamp, payload }) => ({
  canonical: canonicalize(payload),
  bound: attempt(() => signResponse(secret, hash, id, timestamp, payload)),
  payload: attempt(() => signResponse(secret, hash, id, timestamp, payload, { scheme: 'payload' })),
  ed25519: attempt(() => signResponseEd25519(privateKey, hash, id, timestamp, payload)),
}));
process.stdout.write(JSON.stringify(results));
"""


def _number(rng):
    kind = rng.randrange(4)
    if kind == 0:  # any finite double, subnormals and huge exponents included
        while True:
            value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(value):
                return value
    if kind == 1:
        return rng.randint(-(2**53 - 1), 2**53 - 1)
    if kind == 2:
        return round(rng.uniform(-1e6, 1e6), rng.randrange(8))
    return rng.choice([0.0, -0.0, 0.1, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 2.0**53,
                       1e20, 123456789012345680000.0, 0.000001])


def _string(rng):
    return "".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(6)))


def _value(rng, depth):
    kind = rng.randrange(7 if depth < 4 else 5)
    if kind == 0:
        return _number(rng)
    if kind == 1:
        return _string(rng)
    if kind == 2:
        return rng.choice([None, True, False])
    if kind in (3, 4):
        return _number(rng) if kind == 3 else _string(rng)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return _object(rng, depth + 1)


def _object(rng, depth):
    return {_string(rng): _value(rng, depth) for _ in range(rng.randrange(5))}


def _refused_in_javascript(value):
    """A double JavaScript cannot tell from an integer beyond +/-(2^53-1) that JSON.stringify
    would write as an integer token (below 1e21), which the gate refuses."""
    if isinstance(value, float):
        return value.is_integer() and 2**53 - 1 < abs(value) < 1e21
    if isinstance(value, dict):
        return any(_refused_in_javascript(item) for item in value.values())
    if isinstance(value, list):
        return any(_refused_in_javascript(item) for item in value)
    return False


def test_node_and_python_sign_the_same_bytes():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node signer's parity is not checked here")
    rng = random.Random(8785)
    cases = [{"intent_hash": "sha256:" + "%064x" % rng.getrandbits(256),
              "match_id": _string(rng) or "m", "timestamp": rng.randrange(2**31),
              "payload": _object(rng, 0)} for _ in range(400)]
    stdin = json.dumps({"secret": SECRET, "privateKey": PRIVATE_KEY, "cases": cases})
    finished = subprocess.run([node, "-e", NODE_SIGNER], cwd=JS_PACKAGE, input=stdin,
                              capture_output=True, text=True, timeout=120, check=True)
    results = json.loads(finished.stdout)
    assert len(results) == len(cases)
    refused = 0
    for case, result in zip(cases, results):
        args = (case["intent_hash"], case["match_id"], case["timestamp"], case["payload"])
        assert result["canonical"].encode("utf-8") == canonical_json(case["payload"]), case
        if _refused_in_javascript(case["payload"]):
            refused += 1
            for scheme in ("bound", "payload", "ed25519"):
                assert result[scheme].startswith("RangeError: payload integers must be within")
            continue
        assert result["bound"] == sign_response(SECRET, *args), case
        assert result["payload"] == sign_response(SECRET, *args, scheme="payload"), case
        assert result["ed25519"] == sign_response_ed25519(PRIVATE_KEY, *args), case
    assert 0 < refused < len(cases) / 2  # both paths were exercised
