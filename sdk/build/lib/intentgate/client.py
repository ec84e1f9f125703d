"""HTTP client for tenant backends.

Retries follow the service specification: 5xx answers and network failures are retried up to 3
times with exponential backoff and full jitter (a `Retry-After` from the service wins); 4xx
answers fail at once. Verify sends one Idempotency-Key for all of its attempts, so a retry after
a lost answer gets the first verdict back instead of `ReplayedIntent`.
"""
import random
import time
import uuid

import requests

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
from intentgate.signing import ScaleResponse

QUOTA_TEXT = "monthly verification limit reached"


class Client:
    def __init__(self, base_url, api_key, timeout=30.0, max_retries=3, backoff_base=0.5,
                 backoff_cap=8.0, sleep=time.sleep, random_fraction=random.random, session=None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._sleep = sleep
        self._random_fraction = random_fraction
        self.session = session or requests.Session()

    # -- the API -----------------------------------------------------------------------------

    def generate(self, user_token, ttl=None):
        body = {"user_token": user_token}
        if ttl is not None:
            body["ttl"] = ttl
        answer, _ = self._request("POST", "/v1/intent/generate", json=body)
        return IntentSignature(answer["intent_hash"], answer["intent_class"], answer["expires_at"])

    def verify(self, intent_hash, response, idempotency_key=None):
        if isinstance(response, ScaleResponse):
            response = response.to_dict()
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        answer, http = self._request("POST", "/v1/intent/verify", headers=headers,
                                     json={"original_intent_hash": intent_hash,
                                           "response": response})
        return VerificationResult(answer["cleared"], answer["reason"], answer["payload"],
                                  replayed=http.headers.get("Idempotent-Replayed") == "true")

    def usage(self):
        answer, _ = self._request("GET", "/v1/tenant/usage")
        return Usage(answer["email"], answer["plan"], answer["usage_count"],
                     answer["rate_limit"], answer["remaining"])

    def rotate_key(self):
        """Rotate the key; the client uses the new one from then on.

        Retried only when the request could not be sent: once the service has rotated, the old
        key is dead and a retry could only get 401, losing the new key.
        """
        answer, _ = self._request("POST", "/v1/tenant/rotate-key", json={}, unsent_only=True)
        self.api_key = answer["new_key"]
        return KeyRotation(answer["new_key"], answer["message"])

    def guard(self, user_token, call_ai, ttl=None):
        """Generate an intent, call the AI with its hash, verify the answer; return the payload.

        `call_ai(intent_hash)` sends the user's request to the AI service with the hash in the
        `X-Intent-Hash` header and returns its signed answer (a ScaleResponse or a dict).
        Raises Blocked(reason) when the gate blocks the answer.
        """
        intent = self.generate(user_token, ttl=ttl)
        result = self.verify(intent.intent_hash, call_ai(intent.intent_hash))
        if not result.cleared:
            raise Blocked(result.reason, result)
        return result.payload

    # -- transport ---------------------------------------------------------------------------

    def _request(self, method, path, headers=None, json=None, unsent_only=False):
        headers = {"X-Service-Key": self.api_key, **(headers or {})}
        attempt = 0
        while True:
            try:
                http = self.session.request(method, self.base_url + path, headers=headers,
                                            json=json, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as exc:
                sent = not isinstance(exc, requests.ConnectTimeout) and _maybe_sent(exc)
                if attempt >= self.max_retries or (unsent_only and sent):
                    raise ServiceError(f"network failure: {type(exc).__name__}") from exc
                self._sleep(self._backoff(attempt))
                attempt += 1
                continue
            if http.status_code >= 500 and attempt < self.max_retries and not unsent_only:
                self._sleep(self._backoff(attempt, _retry_after(http)))
                attempt += 1
                continue
            return self._answer(http), http

    def _backoff(self, attempt, retry_after=None):
        if retry_after is not None:
            return retry_after
        return self._random_fraction() * min(self.backoff_cap, self.backoff_base * 2 ** attempt)

    @staticmethod
    def _answer(http):
        try:
            body = http.json()
        except ValueError:
            body = {}
        if http.status_code < 400:
            return body
        message = body.get("error") or f"HTTP {http.status_code}"
        details = {"status": http.status_code,
                   "request_id": body.get("request_id") or http.headers.get("X-Request-Id"),
                   "body": body}
        if http.status_code in (401, 403):
            raise AuthenticationError(message, **details)
        if http.status_code == 429:
            error = QuotaExceededError if message == QUOTA_TEXT else RateLimitError
            raise error(message, retry_after=_retry_after(http), **details)
        if http.status_code >= 500:
            raise ServiceError(message, **details)
        if http.status_code in (400, 413, 415, 422):
            raise ValidationError(message, **details)
        raise IntentGateError(message, **details)


def _retry_after(http):
    value = http.headers.get("Retry-After")
    return int(value) if value and value.isdigit() else None


def _maybe_sent(exc):
    """A connection refused or reset before anything was written means the request was not sent."""
    text = str(exc).lower()
    return not any(hint in text for hint in ("refused", "name or service", "failed to establish"))
