"""Receiving webhooks: the SDK accepts what a Standard Webhooks sender signs, and nothing else."""
import base64
import time
from datetime import datetime, timezone

import pytest
from standardwebhooks import Webhook

from intentgate import WebhookReceiver, WebhookVerificationError, verify_webhook

SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
BODY = b'{"type":"webhook.test","timestamp":"2026-11-23T22:00:00Z","data":{"webhook_id":"we_1"}}'


def _headers(secret=SECRET, body=BODY, event_id="msg_1", at=None):
    at = at or int(time.time())
    signature = Webhook(secret).sign(event_id, datetime.fromtimestamp(at, timezone.utc),
                                     body.decode())
    return {"Webhook-Id": event_id, "Webhook-Timestamp": str(at), "Webhook-Signature": signature}


def test_a_signed_event_is_returned_with_its_id():
    event = WebhookReceiver(SECRET).verify(BODY, _headers())
    assert event["id"] == "msg_1" and event["type"] == "webhook.test"
    assert event["data"] == {"webhook_id": "we_1"}
    assert verify_webhook(SECRET, BODY.decode(), _headers())["id"] == "msg_1"


def test_either_of_two_signatures_verifies_during_a_rotation():
    other = "whsec_" + base64.b64encode(b"o" * 24).decode()
    headers = _headers()
    headers["Webhook-Signature"] += " " + _headers(secret=other)["Webhook-Signature"]
    assert WebhookReceiver(other).verify(BODY, headers)["id"] == "msg_1"


@pytest.mark.parametrize("tamper", [
    lambda body, headers: (body.replace(b"we_1", b"we_2"), headers),
    lambda body, headers: (body, {**headers, "Webhook-Id": "msg_2"}),
    lambda body, headers: (body, _headers(at=int(time.time()) - 3600)),  # a replay, late
    lambda body, headers: (body, {k: v for k, v in headers.items() if k != "Webhook-Signature"}),
])
def test_a_changed_late_or_unsigned_event_is_refused(tamper):
    body, headers = tamper(BODY, _headers())
    with pytest.raises(WebhookVerificationError):
        WebhookReceiver(SECRET).verify(body, headers)


@pytest.mark.parametrize("body, signature", [
    (b"\xff\xfe{}", "v1,AAAA"),  # not UTF-8
    (b"{}", "garbage"),  # no "v1,"
    (b"{}", "v1,not base64!"),
    (b"{}", ""),
])
def test_a_malformed_request_is_refused_as_unverified(body, signature):
    """Anyone can send these: a receiver answers them as its except clause says, not 500."""
    headers = {**_headers(), "Webhook-Signature": signature}
    with pytest.raises(WebhookVerificationError):
        WebhookReceiver(SECRET).verify(body, headers)


def test_only_a_whsec_secret_is_taken():
    with pytest.raises(ValueError):
        WebhookReceiver("sig_live_" + "a" * 64)
