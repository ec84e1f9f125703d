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
from intentgate.models import IntentSignature, KeyRotation, Usage, VerificationResult
from intentgate.signing import ScaleResponse, sign_response, signing_message

__all__ = [
    "AuthenticationError", "Blocked", "Client", "IntentGateError", "IntentSignature",
    "KeyRotation", "QuotaExceededError", "RateLimitError", "ScaleResponse", "ServiceError",
    "Usage", "ValidationError", "VerificationResult", "sign_response", "signing_message",
]
