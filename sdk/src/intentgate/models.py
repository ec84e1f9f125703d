"""What the service returns, as small typed objects."""
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class IntentSignature:
    intent_hash: str
    intent_class: str
    expires_at: int


@dataclass(frozen=True)
class VerificationResult:
    cleared: bool
    reason: Optional[str]
    payload: Optional[dict]
    replayed: bool = False  # True when this is an idempotent replay of an earlier verdict


@dataclass(frozen=True)
class Usage:
    email: str
    plan: str
    usage_count: int
    rate_limit: Optional[int]
    remaining: Optional[int]


@dataclass(frozen=True)
class KeyRotation:
    new_key: str = field(repr=False)  # a live key: printing the result must not log it
    message: str
