"""The AI service's side: sign a response for an intent (the service's documented scheme).

    signature = hex(HMAC-SHA256(secret, "{intent_hash}.{match_id}.{timestamp}." + JCS(payload)))

with JCS = RFC 8785 canonical JSON and the whole secret string (prefix included) as the key.
The "payload" scheme signs JCS(payload) alone. The "ed25519" scheme signs the same bound message
with the AI service's Ed25519 private key: standard base64 (88 characters) of the signature.
"""
import base64
import hashlib
import hmac
import time
import uuid
from dataclasses import asdict, dataclass

import rfc8785

from intentgate.keys import load_ed25519_private_key


MAX_SAFE_INTEGER = 2**53 - 1
INTEGER_RANGE_MESSAGE = (
    "payload integers must be within ±(2^53-1); send larger values as strings")


class UnsignablePayload(ValueError):
    """The payload has no RFC 8785 form that binds exactly this value, so nothing is signed."""


class IntegerOutOfRange(UnsignablePayload):
    """An integer beyond +/-(2**53 - 1): RFC 8785 numbers are IEEE doubles, so such an integer
    would be signed as a rounded double that other integers share. Send it as a string."""


class NonFiniteNumber(UnsignablePayload):
    """NaN or an infinity: no JSON text, so no canonical form."""


def canonical_json(value):
    """RFC 8785 bytes of `value`, or UnsignablePayload when no such bytes bind it exactly."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        raise IntegerOutOfRange(INTEGER_RANGE_MESSAGE) from None
    except rfc8785.FloatDomainError:
        raise NonFiniteNumber("payload numbers must be finite (no NaN or infinity)") from None
    except (rfc8785.CanonicalizationError, UnicodeError) as exc:
        if isinstance(exc, UnicodeError) or isinstance(exc.__cause__, UnicodeError):
            raise UnsignablePayload(
                "payload strings must be valid Unicode (no lone surrogates)") from None
        raise UnsignablePayload(f"payload cannot be canonicalized (RFC 8785): {exc}") from None
    except ValueError:
        # rfc8785 fails this way only while spelling an integer past Python's int-to-str digit
        # limit into its own IntegerDomainError message.
        raise IntegerOutOfRange(INTEGER_RANGE_MESSAGE) from None
    except RecursionError:
        # Deeper than Python's stack; the gate refuses bodies past 64 levels anyway.
        raise UnsignablePayload("payload is nested too deeply") from None


def jcs_number(text):
    """An integer token of JSON the gate wrote, read as RFC 8785 reads it: JCS numbers are IEEE
    doubles and spell a whole double as digits, so a token beyond +/-(2**53 - 1) is a double
    (a cleared payload's 1e16 comes back as 10000000000000000), never an exact integer, which
    would differ from the double that was signed and which canonical_json refuses.
    `json.loads(text, parse_int=jcs_number)`."""
    value = int(text)
    return value if abs(value) <= MAX_SAFE_INTEGER else float(text)


def signing_message(intent_hash, match_id, timestamp, payload, scheme="bound"):
    """The bytes a response's signature covers. Refuses (TypeError, ValueError) what the
    service would refuse anyway, as the Node signer does: a signature over such a response
    could never clear."""
    if scheme not in ("bound", "payload"):
        raise ValueError("scheme must be 'bound' or 'payload'")
    if not isinstance(payload, dict):
        raise TypeError("payload must be a JSON object (a dict)")
    canonical = canonical_json(payload)
    if scheme == "payload":
        return canonical
    _require_text(intent_hash, "intent_hash")
    _require_text(match_id, "match_id")
    # type(), not isinstance: True is an int to Python, and no timestamp to the service.
    if type(timestamp) is not int:
        raise TypeError("timestamp must be an integer number of Unix seconds")
    if abs(timestamp) > MAX_SAFE_INTEGER:
        raise ValueError("timestamp must be Unix seconds within ±(2^53-1)")
    return f"{intent_hash}.{match_id}.{timestamp}.".encode("utf-8") + canonical


def sign_response(secret, intent_hash, match_id, timestamp, payload, scheme="bound"):
    """Return the 64-hex signature of a response."""
    _require_text(secret, "secret", "the signing secret string (sig_live_...)")
    message = signing_message(intent_hash, match_id, timestamp, payload, scheme)
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _require_text(value, name, what="a string"):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {what}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} must be valid Unicode (no lone surrogates)") from None


def sign_response_ed25519(private_key, intent_hash, match_id, timestamp, payload):
    """Return the base64 Ed25519 signature of a response's bound message.

    `private_key` is PKCS#8 PEM (str or bytes) or a cryptography Ed25519PrivateKey; pass the
    key object to skip parsing the PEM on every call."""
    key = load_ed25519_private_key(private_key)
    message = signing_message(intent_hash, match_id, timestamp, payload)
    return base64.b64encode(key.sign(message)).decode("ascii")


@dataclass(frozen=True)
class ScaleResponse:
    """The AI service's signed response, as the tenant sends it to verify."""

    match_id: str
    payload: dict
    timestamp: int
    signature: str

    @classmethod
    def sign(cls, secret, intent_hash, payload, match_id=None, timestamp=None, scheme="bound"):
        match_id = uuid.uuid4().hex if match_id is None else match_id  # "" is refused
        timestamp = int(time.time()) if timestamp is None else timestamp
        signature = sign_response(secret, intent_hash, match_id, timestamp, payload, scheme)
        return cls(match_id, payload, timestamp, signature)

    @classmethod
    def sign_ed25519(cls, private_key, intent_hash, payload, match_id=None, timestamp=None):
        """As `sign`, for a tenant on the ed25519 scheme: signed with the AI service's key."""
        match_id = uuid.uuid4().hex if match_id is None else match_id  # "" is refused
        timestamp = int(time.time()) if timestamp is None else timestamp
        signature = sign_response_ed25519(private_key, intent_hash, match_id, timestamp, payload)
        return cls(match_id, payload, timestamp, signature)

    def to_dict(self):
        return asdict(self)
