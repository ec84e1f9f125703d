"""Typed errors: each carries the service's error text, HTTP status and request id."""


class IntentGateError(Exception):
    def __init__(self, message, status=None, request_id=None, body=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.request_id = request_id
        self.body = body or {}

    def __str__(self):
        # What is known of it: a Blocked verdict has a request id but no error status.
        where = ", ".join(part for part in (self.status and f"status {self.status}",
                                            self.request_id and f"request {self.request_id}")
                          if part)
        return f"{self.message} ({where})" if where else self.message


class AuthenticationError(IntentGateError):
    """401 or 403: the key is missing, wrong, rotated, deactivated, of the wrong kind, or lacks
    the scope the call needs (the error text names it)."""


class ValidationError(IntentGateError):
    """400, 413 or 422: the request was refused as it stands; retrying it will not help."""


class RateLimitError(IntentGateError):
    """429 `rate limit exceeded`: wait `retry_after` seconds."""

    def __init__(self, message, retry_after=None, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class QuotaExceededError(RateLimitError):
    """429 `monthly verification limit reached`: the plan's month is used up."""


class ServiceError(IntentGateError):
    """5xx or a network failure that persisted through every retry.

    `maybe_sent` is False only when no connection could be opened, so the service never saw
    the request; after a 5xx, or a failure once connected, the service may have acted on it.
    """

    def __init__(self, message, maybe_sent=True, **kwargs):
        super().__init__(message, **kwargs)
        self.maybe_sent = maybe_sent


class Blocked(IntentGateError):
    """The verification gate blocked the AI response: do not show it to the user.
    `request_id` is the verify's, to quote to the service's operators as with any error."""

    def __init__(self, reason, result=None, request_id=None):
        super().__init__(f"AI response blocked: {reason}", request_id=request_id)
        self.reason = reason
        self.result = result
