"""Client SDK for the intent verification service."""
from intentgate.client import Client
from intentgate.errors import (
    AuthenticationError,
    Blocked,
    IntentGateError,
    QuotaExceededError,
    RateLimitError,
    ServiceError,
    ValidationError,
)
from intentgate.keys import Ed25519KeyPair, InvalidSigningKey, generate_ed25519_key_pair
from intentgate.models import IntentSignature, KeyRotation, Usage, VerificationResult
from intentgate.signing import (
    ScaleResponse,
    UnsignablePayload,
    jcs_number,
    sign_response,
    sign_response_ed25519,
    signing_message,
)
from intentgate.webhooks import WebhookReceiver, WebhookVerificationError, verify_webhook

__all__ = [
    "AuthenticationError", "Blocked", "Client", "Ed25519KeyPair", "IntentGateError",
    "IntentSignature", "InvalidSigningKey", "KeyRotation", "QuotaExceededError",
    "RateLimitError", "ScaleResponse", "ServiceError", "UnsignablePayload", "Usage",
    "ValidationError", "VerificationResult", "WebhookReceiver", "WebhookVerificationError",
    "generate_ed25519_key_pair", "jcs_number", "sign_response", "sign_response_ed25519",
    "signing_message", "verify_webhook",
]
