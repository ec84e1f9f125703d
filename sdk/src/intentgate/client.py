"""HTTP client for tenant backends.

Retries follow the service specification: 5xx answers and network failures are retried up to 3
times with exponential backoff and full jitter (a `Retry-After` from the service wins); 4xx
answers fail at once. Verify sends one Idempotency-Key for all of its attempts, so a retry after
a lost answer gets the first verdict back instead of `ReplayedIntent`.
"""
import json
import math
import random
import re
import time
import uuid
from urllib.parse import quote, urlencode, urlsplit

import requests
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError

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
from intentgate.signing import ScaleResponse, jcs_number

QUOTA_TEXT = "monthly verification limit reached"
# The key travels in a header: one that could not (a line break or space from a secret file)
# is refused here, where requests would raise InvalidHeader quoting the whole key.
API_KEY_PATTERN = re.compile(r"[\x21-\x7e]+")
API_KEY_TEXT = "api_key must be a non-empty string of printable ASCII"
CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f]")
# An Idempotency-Key requests can send as it is: printable ASCII, no space at either end (which
# HTTP would strip, or requests refuse with InvalidHeader). Empty is sent: the service's 400.
IDEMPOTENCY_KEY_PATTERN = re.compile(r"([\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?)?")
IDEMPOTENCY_KEY_TEXT = ("idempotency_key must be a string of printable ASCII, without a space "
                        "at either end")
# The longest Retry-After a 5xx is retried after. A longer one (a proxy's, or 'Retry-After:
# 99999999999') would hold the caller for hours or for ever, and waiting less would not honour
# it: the error is raised at once instead, and the caller decides, as after a 429.
MAX_RETRY_AFTER = 60
# What requests raises when the network fails, before or during the answer. An answer cut off
# mid-body (a reset, a connection closed short of its Content-Length or last chunk) is
# ChunkedEncodingError, and a body that does not decompress ContentDecodingError: neither is a
# ConnectionError, yet both are the lost answer that a retry (with verify's one
# Idempotency-Key) is for.
NETWORK_FAILURES = (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError,
                    requests.exceptions.ContentDecodingError)


class Client:
    def __init__(self, base_url, api_key, timeout=30.0, max_retries=3, backoff_base=0.5,
                 backoff_cap=8.0, sleep=time.sleep, random_fraction=random.random, session=None,
                 verify=None):
        """`verify`: the path of a CA bundle, for a service whose certificate a private CA
        issued, or False to skip verification (tests only); None keeps requests' default.
        Given per request, it wins over a session's `verify` and REQUESTS_CA_BUNDLE."""
        if not isinstance(api_key, str) or not API_KEY_PATTERN.fullmatch(api_key):
            raise ValidationError(API_KEY_TEXT)  # never the key itself: errors reach logs
        # Refused here, as Node's client does, not at the first call as one of requests' own
        # exceptions (InvalidSchema, InvalidURL, ValueError), which are not IntentGateErrors.
        _check_base_url(base_url, custom_session=session is not None)
        if not all(part is None or _positive_number(part) for part in
                   (timeout if isinstance(timeout, tuple) and len(timeout) == 2 else (timeout,))):
            raise ValidationError("timeout must be a positive number of seconds or None "
                                  "(requests' meaning: no limit), or a (connect, read) pair")
        for name, value in (("backoff_base", backoff_base), ("backoff_cap", backoff_cap)):
            if not (_positive_number(value) or value == 0):
                raise ValidationError(f"{name} must be a number of seconds, at least 0")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValidationError("max_retries must be an integer of at least 0")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._sleep = sleep
        self._random_fraction = random_fraction
        self.session = session or requests.Session()
        self.tls_verify = verify  # not `self.verify`: that is the API call

    # -- the API -----------------------------------------------------------------------------

    def generate(self, user_token, ttl=None):
        body = {"user_token": user_token}
        if ttl is not None:
            body["ttl"] = ttl
        answer, _ = self._request("POST", "/v1/intent/generate", json=body,
                                  expect=("intent_hash", "intent_class", "expires_at"))
        return IntentSignature(answer["intent_hash"], answer["intent_class"], answer["expires_at"])

    def verify(self, intent_hash, response, idempotency_key=None):
        return self._verify(intent_hash, response, idempotency_key)[0]

    def _verify(self, intent_hash, response, idempotency_key=None):
        """The verdict and the X-Request-Id it came with (which guard's Blocked carries)."""
        if isinstance(response, ScaleResponse):
            response = response.to_dict()
        # An empty key is sent as given (the service refuses it, 400), as Node's client refuses
        # it: never quietly replaced by a fresh one, which would make a retry a new request.
        if idempotency_key is not None and not (
                isinstance(idempotency_key, str)
                and IDEMPOTENCY_KEY_PATTERN.fullmatch(idempotency_key)):
            raise ValidationError(IDEMPOTENCY_KEY_TEXT)
        headers = {"Idempotency-Key": uuid.uuid4().hex if idempotency_key is None
                   else idempotency_key}
        answer, http = self._request("POST", "/v1/intent/verify", headers=headers,
                                     json={"original_intent_hash": intent_hash,
                                           "response": response},
                                     expect=("cleared", "reason", "payload"))
        # A verdict is the service's only in its own shape: a gate never takes "false" or 1
        # for cleared (a proxy's or a hostile answer), it raises.
        # Cleared is a payload and no reason, blocked a reason and no payload: nothing else.
        if not (answer["cleared"] is True and answer["reason"] is None
                and isinstance(answer["payload"], dict)
                or answer["cleared"] is False and isinstance(answer["reason"], str)
                and answer["payload"] is None):
            raise ServiceError(f"the service answered {http.status_code} without a verdict",
                               status=http.status_code,
                               request_id=http.headers.get("X-Request-Id"))
        return (VerificationResult(answer["cleared"], answer["reason"], answer["payload"],
                                   replayed=http.headers.get("Idempotent-Replayed") == "true"),
                http.headers.get("X-Request-Id"))

    def usage(self):
        answer, _ = self._request("GET", "/v1/tenant/usage", expect=(
            "email", "plan", "usage_count", "rate_limit", "remaining"))
        return Usage(answer["email"], answer["plan"], answer["usage_count"],
                     answer["rate_limit"], answer["remaining"])

    def rotate_key(self):
        """Rotate the key; the client uses the new one from then on.

        Retried only when the request could not be sent: once the service has rotated, the old
        key is dead and a retry could only get 401, losing the new key.
        """
        answer, _ = self._request("POST", "/v1/tenant/rotate-key", json={}, unsent_only=True,
                                  expect=("new_key", "message"))
        self.api_key = answer["new_key"]
        return KeyRotation(answer["new_key"], answer["message"])

    # -- self-service (answers are the service's JSON, as dicts) -----------------------------
    # Creating and revoking are retried only when the request could not be sent: a retry of a
    # creation that went through would make a second key.

    def create_key(self, name, expires_in=None, scopes=None):
        """A new API key for this tenant; `api_key` in the answer is shown only this once.
        `scopes` (default ["intents"]): what the key may do, never more than this client's key
        holds. A backend that only generates and verifies needs no more than "intents"."""
        # None leaves a member out; anything else (0, "") is sent, and the service judges it.
        body = {"name": name, **({"expires_in": expires_in} if expires_in is not None else {}),
                **({"scopes": list(scopes)} if scopes is not None else {})}
        return self._request("POST", "/v1/tenant/keys", json=body, unsent_only=True)[0]

    def list_keys(self):
        return self._list("GET", "/v1/tenant/keys", "keys")

    def revoke_key(self, key_id):
        return self._request("DELETE", f"/v1/tenant/keys/{_segment(key_id)}", unsent_only=True)[0]

    def add_signing_key(self, public_key, name=None, expires_in=None):
        """Register the AI service's Ed25519 public key (base64 of 32 bytes, or PEM)."""
        body = {"public_key": public_key, **({"name": name} if name is not None else {}),
                **({"expires_in": expires_in} if expires_in is not None else {})}
        return self._request("POST", "/v1/tenant/signing-keys", json=body, unsent_only=True)[0]

    def list_signing_keys(self):
        return self._list("GET", "/v1/tenant/signing-keys", "signing_keys")

    def revoke_signing_key(self, key_id):
        return self._request("DELETE", f"/v1/tenant/signing-keys/{_segment(key_id)}",
                             unsent_only=True)[0]

    def set_signature_scheme(self, scheme, grace_seconds=0):
        """Switch to "bound" or "ed25519" ("payload" only an operator may choose); the previous
        scheme verifies for `grace_seconds` more."""
        return self._request("PUT", "/v1/tenant/signature-scheme",
                             json={"scheme": scheme, "grace_seconds": grace_seconds})[0]

    def audit_log(self, limit=50, before=None):
        # Encoded, as Node's URLSearchParams does: a `before` of '5&limit=200' is one value, not
        # a second parameter, and a `before` of 0 is sent, not dropped.
        query = urlencode({"limit": limit, **({"before": before} if before is not None else {})})
        return self._list("GET", "/v1/tenant/audit-log?" + query, "entries")

    def daily_usage(self, days=30):
        return self._list("GET", "/v1/tenant/usage/daily?" + urlencode({"days": days}), "days")

    def guard(self, user_token, call_ai, ttl=None):
        """Generate an intent, call the AI with its hash, verify the answer; return the payload.

        `call_ai(intent_hash)` sends the user's request to the AI service with the hash in the
        `X-Intent-Hash` header and returns its signed answer (a ScaleResponse or a dict).
        Raises Blocked(reason) when the gate blocks the answer.
        """
        intent = self.generate(user_token, ttl=ttl)
        result, request_id = self._verify(intent.intent_hash, call_ai(intent.intent_hash))
        if result.cleared is not True:
            raise Blocked(result.reason, result, request_id=request_id)
        return result.payload

    # -- transport ---------------------------------------------------------------------------

    def _list(self, method, path, member):
        """The answer's list of records (`member`): anything else is not the service's answer
        (a proxy's, a hostile one), an error of ours rather than a string or None returned."""
        answer, http = self._request(method, path, expect=(member,))
        records = answer[member]
        if not (isinstance(records, list) and all(isinstance(record, dict)
                                                   for record in records)):
            raise ServiceError(f"the service answered {http.status_code} without a list of "
                               f"{member}", status=http.status_code,
                               request_id=http.headers.get("X-Request-Id"))
        return records

    def _request(self, method, path, headers=None, json=None, unsent_only=False, expect=()):
        """The answer and the response; `expect` names the members the caller reads."""
        headers = {"X-Service-Key": self.api_key, **(headers or {})}
        body = None
        if json is not None:
            body = _json_body(json)
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            try:
                # Redirects are not followed: the service never redirects, and requests would
                # send X-Service-Key and the body (a user token) on to any Location's host.
                http = self.session.request(method, self.base_url + path, headers=headers,
                                            data=body, timeout=self.timeout,
                                            verify=self.tls_verify, allow_redirects=False)
            except NETWORK_FAILURES as exc:
                sent = _maybe_sent(exc)
                if attempt >= self.max_retries or (unsent_only and sent):
                    raise ServiceError(f"network failure: {type(exc).__name__}",
                                       maybe_sent=sent) from exc
                self._sleep(self._backoff(attempt))
                attempt += 1
                continue
            retry_after = _retry_after(http)
            if (http.status_code >= 500 and attempt < self.max_retries and not unsent_only
                    and (retry_after is None or retry_after <= MAX_RETRY_AFTER)):
                self._sleep(self._backoff(attempt, retry_after))
                attempt += 1
                continue
            return _members(self._answer(http), http, expect), http

    def _backoff(self, attempt, retry_after=None):
        if retry_after is not None:
            return retry_after
        return self._random_fraction() * min(self.backoff_cap, self.backoff_base * 2 ** attempt)

    @staticmethod
    def _answer(http):
        try:
            # A cleared payload is JCS text, which has no NaN or Infinity: an answer with one
            # is not the service's.
            # Read as JSON is written, UTF-8 (RFC 8259), whatever charset the Content-Type
            # names: requests' json() decodes a text/* answer as ISO-8859-1, which changed a
            # cleared payload's non-ASCII text from what was signed.
            body = json.loads(http.content, parse_int=jcs_number, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            # RecursionError: JSON nested deeper than the interpreter's stack (a proxy's or a
            # hostile answer), which the json module raises instead of ValueError.
            body = None
        request_id = (body.get("request_id") if isinstance(body, dict) else None) \
            or http.headers.get("X-Request-Id")
        if 300 <= http.status_code < 400:
            raise IntentGateError(f"the service answered {http.status_code}, a redirect, which "
                                  "is not followed", status=http.status_code,
                                  request_id=request_id)
        if http.status_code < 400:
            if isinstance(body, dict):
                return body
            # Not the service's answer (a proxy's page, say): an error of ours, as in Node,
            # rather than a KeyError where the caller reads a field.
            raise ServiceError(f"the service answered {http.status_code} without a JSON object",
                               status=http.status_code, request_id=request_id)
        body = body if isinstance(body, dict) else {}
        message = body.get("error") or f"HTTP {http.status_code}"
        details = {"status": http.status_code,
                   "request_id": request_id,
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


def _members(answer, http, expect):
    """`answer`, or ServiceError when a member the call reads is missing: a JSON object that is
    not the service's answer (a proxy's `{}`, say) is an error of ours, as in Node, not a
    KeyError, and rotate_key never takes a missing key for the new one."""
    missing = [name for name in expect if name not in answer]
    if missing:
        raise ServiceError(f"the service answered {http.status_code} without "
                           f"{', '.join(missing)}", status=http.status_code,
                           request_id=http.headers.get("X-Request-Id"))
    return answer


def _segment(key_id):
    """A key id as one path segment, as Node's encodeURIComponent makes it. Unquoted, an id
    such as '../signing-keys/3' (an id taken from a form, say) was resolved by urllib3 into
    another resource's path, so revoke_key revoked a signing key; '?' and '#' cut it short."""
    return quote(str(key_id), safe="")


def _json_body(value):
    """The request body as JSON text (what requests' json= sends), or ValidationError before
    anything is sent: NaN or an infinity (a ttl of float("inf"), a payload of NaN) has no JSON
    form, nor has a set or a bytes value, nor a payload nested deeper than Python's stack."""
    try:
        return json.dumps(value, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise ValidationError(f"request body cannot be sent as JSON: {reason}") from None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _positive_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _check_base_url(base_url, custom_session):
    """http(s):// with a host; with a session of the caller's, any scheme its adapters may
    serve (http+unix://, say) with a location. No space or control character anywhere (a line
    break from an environment file: urlsplit drops it, requests then refuses the URL at every
    call), and no credentials in it, as Node's fetch refuses them."""
    try:
        parts = urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is not None and (CONTROL_OR_SPACE.search(base_url) or "@" in parts.netloc):
            valid = False
        elif parts is not None and custom_session and parts.scheme not in ("http", "https"):
            valid = bool(parts.scheme and parts.netloc)
        else:
            valid = (parts is not None and parts.scheme in ("http", "https")
                     and bool(parts.hostname) and (parts.port is None or parts.port > 0))
    except ValueError:  # a port out of range or not a number, a bracket left open
        valid = False
    if not valid:
        raise ValidationError("base_url must be an http:// or https:// URL with a host, "
                              "without spaces or credentials")


def _retry_after(http):
    """Retry-After in delay-seconds, or None. ASCII digits only: str.isdigit() also takes '²'
    and other digits int() refuses (headers are read as Latin-1), which raised ValueError."""
    value = http.headers.get("Retry-After")
    return int(value) if value and re.fullmatch(r"[0-9]+", value) else None


def _maybe_sent(exc):
    """Whether the request may have reached the service, judged by the exception's type.

    Only a failure to open the connection proves it did not: refused, unreachable, a name that
    does not resolve, a connect timeout. urllib3 reports each as ConnectTimeoutError (or its
    subclasses NewConnectionError and NameResolutionError) inside requests' exception. Anything
    later (a reset, a closed or garbled answer, a read timeout, a TLS failure) may have come
    after the service acted. The error text is not consulted: it differs between systems and
    part of it can come from the other end.
    """
    cause = exc.args[0] if exc.args else None
    reason = cause.reason if isinstance(cause, MaxRetryError) else cause
    return not isinstance(reason, ConnectTimeoutError)
