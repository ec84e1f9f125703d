"""The response signature of CONTRACT.md.

    signature = hex(HMAC-SHA256(secret, message))
    bound scheme (default): message = "{intent_hash}.{match_id}.{timestamp}." + JCS(payload)
    payload scheme:         message = JCS(payload)

JCS is RFC 8785 canonical JSON; the HMAC key is the UTF-8 bytes of the whole secret string,
prefix included. The SDK's signer implements the same function against the same test vectors.
"""
import hashlib
import hmac

import rfc8785

from app.errors import BadRequest

SCHEMES = ("bound", "payload")
MAX_SAFE_INTEGER = 2**53 - 1


def canonical_json(value, field="response.payload"):
    """RFC 8785 bytes. JCS models numbers as IEEE doubles (as JavaScript does), so integers
    beyond +/-(2**53 - 1) are canonicalized as the doubles a JavaScript signer would see; only
    non-finite numbers are refused (400)."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return canonical_json(_as_doubles(value), field)
    except rfc8785.CanonicalizationError:
        raise BadRequest(f"{field} cannot be canonicalized (RFC 8785): numbers must be finite") \
            from None


def _as_doubles(value):
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_doubles(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        return float(value)
    return value


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
