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
        event = self._webhook.verify(body, lowered)
        return {"id": lowered["webhook-id"], **event}


def verify_webhook(secret, body, headers):
    """One call: WebhookReceiver(secret).verify(body, headers)."""
    return WebhookReceiver(secret).verify(body, headers)
