"""The response signature of CONTRACT.md.

    signature = hex(HMAC-SHA256(secret, message))
    bound scheme (default): message = "{intent_hash}.{match_id}.{timestamp}." + JCS(payload)
    payload scheme:         message = JCS(payload)

JCS is RFC 8785 canonical JSON, computed by the SDK's own function (intentgate.signing) so the
two sides cannot drift: both refuse integers beyond +/-(2**53 - 1) and non-finite numbers.
tests/vectors/signatures.json pins the bytes. The HMAC key is the UTF-8 bytes of the whole
secret string, prefix included.
"""
import base64
import binascii
import hashlib
import hmac
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from intentgate.signing import (
    INTEGER_RANGE_MESSAGE,
    IntegerOutOfRange,
    NonFiniteNumber,
    UnsignablePayload,
    canonical_json as jcs,
)

from app.errors import BadRequest


def canonical_json(value, field="response.payload"):
    """RFC 8785 bytes, as the SDK's signer makes them (one implementation for both sides).

    A value with no exact canonical form is a 400, never a conversion: the payload the gate
    returns must be the very value whose canonical bytes were signed, and an integer beyond
    +/-(2**53 - 1) shares its canonical (double) form with its neighbours."""
    try:
        return jcs(value)
    except IntegerOutOfRange:
        raise BadRequest(INTEGER_RANGE_MESSAGE) from None
    except NonFiniteNumber:
        raise BadRequest(f"{field} cannot be canonicalized (RFC 8785): numbers must be finite") \
            from None
    except UnsignablePayload:
        # Unreachable from a parsed request body (app.strict_json refuses lone surrogates first).
        raise BadRequest(f"{field} cannot be canonicalized (RFC 8785)") from None


def signing_message(scheme, intent_hash, match_id, timestamp, canonical_payload):
    if scheme == "payload":
        return canonical_payload
    return f"{intent_hash}.{match_id}.{timestamp}.".encode("utf-8") + canonical_payload


def ed25519_matches(public_keys, message, signature):
    """True when `signature` (standard base64 of 64 bytes) is an Ed25519 signature of `message`
    by one of `public_keys` (base64 of 32 raw bytes each). Only the canonical base64 form
    counts: another spelling of the same bytes (non-zero trailing bits, say) is another
    signature string, and a signature's text must have one form, as its bytes do."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != 64 or base64.b64encode(raw).decode("ascii") != signature:
        return False
    for public_key in public_keys:
        try:
            _ed25519_key(public_key).verify(raw, message)
            return True
        except InvalidSignature:
            continue
    return False


@lru_cache(maxsize=1024)
def _ed25519_key(public_key):
    # A parsed public key, by its own bytes: which keys are active is read on every request.
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key))


def sign(secret, message):
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def matches(secrets, message, signature):
    """True when `signature` (hex, any case) is the HMAC of `message` under one of `secrets`."""
    presented = signature.lower().encode("ascii", "replace")
    # Every secret is tried, so timing does not tell which one (if any) matched.
    results = [hmac.compare_digest(sign(secret, message).encode("ascii"), presented)
               for secret in secrets]
    return any(results)
