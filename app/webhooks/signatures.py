"""Standard Webhooks signatures (standardwebhooks.com): the endpoint secret `whsec_` + base64
of random bytes, and `v1,` + base64 HMAC-SHA256 over `id.timestamp.body` keyed with the decoded
bytes. During a rotation's grace each attempt carries both signatures, space-separated, so a
receiver verifies with either secret."""
import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24


def new_secret():
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _key(secret):
    return base64.b64decode(secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX)
                            else secret)


def signature(secret, event_id, timestamp, body):
    message = f"{event_id}.{timestamp}.".encode("utf-8") + body
    digest = hmac.new(_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(secrets_in_force, event_id, timestamp, body):
    """The webhook-* headers of one attempt, signed with every secret in force."""
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(secret, event_id, timestamp, body)
                                      for secret in secrets_in_force),
    }
