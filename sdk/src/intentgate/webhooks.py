"""Receiving the service's webhooks: verify an incoming event before trusting it.

Events are Standard Webhooks (standardwebhooks.com), so this is the `standardwebhooks`
library's own check, not a hand-written HMAC: the signature (any of several, during a secret
rotation), and a webhook-timestamp within five minutes, against replays. Deduplicate by
`event["id"]` (the webhook-id, the same on every attempt): delivery is at least once.
"""
from standardwebhooks import Webhook, WebhookVerificationError

__all__ = ["WebhookReceiver", "WebhookVerificationError", "verify_webhook"]


class WebhookReceiver:
    """Holds an endpoint's secret (`whsec_...`); `verify` each request's body and headers."""

    def __init__(self, secret):
        if not isinstance(secret, str) or not secret.startswith("whsec_"):
            raise ValueError("secret must be the endpoint's whsec_... secret")
        self._webhook = Webhook(secret)

    def verify(self, body, headers):
        """Return the event as a dict (`id`, `type`, `timestamp`, `data`), or raise
        WebhookVerificationError. `body` is the raw request body (bytes or str), exactly as
        received; `headers` any mapping (Flask's request.headers will do)."""
        lowered = {name.lower(): value for name, value in dict(headers).items()}
        try:
            event = self._webhook.verify(body, lowered)
        except WebhookVerificationError:
            raise
        except (ValueError, TypeError):
            # The library reads some malformed requests (a body that is not UTF-8, a signature
            # header without its "v1,") before it compares anything, and fails on them with
            # other errors: anyone can send those, and a receiver answers them like any
            # request that does not verify (UnicodeError and binascii.Error are ValueErrors).
            raise WebhookVerificationError("the request is not a signed event") from None
        if not isinstance(event, dict):
            raise WebhookVerificationError("the event is not a JSON object")
        return {"id": lowered["webhook-id"], **event}


def verify_webhook(secret, body, headers):
    """One call: WebhookReceiver(secret).verify(body, headers)."""
    return WebhookReceiver(secret).verify(body, headers)
