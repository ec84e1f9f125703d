"""The response signature of CONTRACT.md.

    signature = hex(HMAC-SHA256(secret, message))
    bound scheme (default): message = "{intent_hash}.{match_id}.{timestamp}." + JCS(payload)
    payload scheme:         message = JCS(payload)

JCS is RFC 8785 canonical JSON, computed by the SDK's own function (intentgate.signing) so the
two sides cannot drift; tests/vectors/signatures.json pins the bytes. The HMAC key is the UTF-8
bytes of the whole secret string, prefix included.
"""
import hashlib
import hmac

import rfc8785
from intentgate.signing import canonical_json as jcs

from app.errors import BadRequest


def canonical_json(value, field="response.payload"):
    """RFC 8785 bytes, as the SDK's signer makes them (one implementation for both sides):
    integers beyond +/-(2**53 - 1) become the doubles a JavaScript signer would see; only
    non-finite numbers are refused (400)."""
    try:
        return jcs(value)
    except rfc8785.CanonicalizationError:
        raise BadRequest(f"{field} cannot be canonicalized (RFC 8785): numbers must be finite") \
            from None


def signing_message(scheme, intent_hash, match_id, timestamp, canonical_payload):
    if scheme == "payload":
        return canonical_payload
    return f"{intent_hash}.{match_id}.{timestamp}.".encode("utf-8") + canonical_payload


def sign(secret, message):
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def matches(secrets, message, signature):
    """True when `signature` (hex, any case) is the HMAC of `message` under one of `secrets`."""
    presented = signature.lower().encode("ascii", "replace")
    # Every secret is tried, so timing does not tell which one (if any) matched.
    results = [hmac.compare_digest(sign(secret, message).encode("ascii"), presented)
               for secret in secrets]
    return any(results)
