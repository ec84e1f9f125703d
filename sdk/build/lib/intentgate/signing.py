"""The AI service's side: sign a response for an intent (the service's documented scheme).

    signature = hex(HMAC-SHA256(secret, "{intent_hash}.{match_id}.{timestamp}." + JCS(payload)))

with JCS = RFC 8785 canonical JSON and the whole secret string (prefix included) as the key.
The "payload" scheme signs JCS(payload) alone.
"""
import hashlib
import hmac
import time
import uuid
from dataclasses import asdict, dataclass

import rfc8785


MAX_SAFE_INTEGER = 2**53 - 1


def canonical_json(value):
    """RFC 8785 bytes; integers beyond +/-(2**53 - 1) become the doubles JavaScript would see."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return rfc8785.dumps(_as_doubles(value))


def _as_doubles(value):
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_doubles(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        return float(value)
    return value


def signing_message(intent_hash, match_id, timestamp, payload, scheme="bound"):
    canonical = canonical_json(payload)
    if scheme == "payload":
        return canonical
    if scheme != "bound":
        raise ValueError("scheme must be 'bound' or 'payload'")
    return f"{intent_hash}.{match_id}.{timestamp}.".encode("utf-8") + canonical


def sign_response(secret, intent_hash, match_id, timestamp, payload, scheme="bound"):
    """Return the 64-hex signature of a response."""
    message = signing_message(intent_hash, match_id, timestamp, payload, scheme)
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class ScaleResponse:
    """The AI service's signed response, as the tenant sends it to verify."""

    match_id: str
    payload: dict
    timestamp: int
    signature: str

    @classmethod
    def sign(cls, secret, intent_hash, payload, match_id=None, timestamp=None, scheme="bound"):
        match_id = match_id or uuid.uuid4().hex
        timestamp = int(time.time()) if timestamp is None else timestamp
        signature = sign_response(secret, intent_hash, match_id, timestamp, payload, scheme)
        return cls(match_id, payload, timestamp, signature)

    def to_dict(self):
        return asdict(self)
