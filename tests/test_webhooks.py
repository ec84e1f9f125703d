"""Webhooks (CONTRACT.md, Webhooks): endpoints, Standard Webhooks signatures, retries, the
SSRF rules, rotation, usage alerts; delivered to a real receiver over HTTP by the worker's own
functions (tests/test_multiprocess_webhooks.py runs the worker as processes)."""
import base64
import json
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy
import time_machine
from cryptography.fernet import Fernet
from intentgate import verify_webhook
from sqlalchemy import select, update
from standardwebhooks import Webhook, WebhookVerificationError

from app.clock import billing_period, now_seconds
from app.extensions import db
from app.sql import unit_of_work
from app.tenants.models import MonthlyUsage
from app.tenants import audit
from app.webhooks import delivery, events, signatures, ssrf
from app.webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from tests.conftest import TEST_DATABASE_URL
from tests.receivers import Receiver
from tests.servers import ROOT
from tests.support import assert_envelope, postgresql_connection, wait_for_a_lock_wait

NOT_ENCODED = "url's path and query must be percent-encoded (no spaces or non-ASCII characters)"


@pytest.fixture
def settings(settings):
    settings.update(WEBHOOK_ALLOW_PRIVATE_ADDRESSES=True, WEBHOOK_RETRY_DELAYS=(0, 0))
    return settings


def _create(client, tenant, url, leak_watch, **body):
    answer = client.post("/v1/tenant/webhooks", headers=tenant.headers, json={"url": url, **body})
    assert answer.status_code == 201, answer.get_json()
    leak_watch.add(answer.get_json()["secret"])
    return answer.get_json()


def _deliver(app):
    with app.app_context():
        return delivery.deliver_due(app.config)


def _deliveries(client, tenant, webhook_id):
    answer = client.get(f"/v1/tenant/webhooks/{webhook_id}/deliveries", headers=tenant.headers)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()["deliveries"]


def test_a_test_event_arrives_signed_as_standard_webhooks(app, client, tenant, leak_watch):
    with Receiver() as receiver:
        created = _create(client, tenant, receiver.url, leak_watch)
        assert created["secret"].startswith("whsec_")
        assert created["events"] == ["usage.threshold", "api_key.expiring", "audit.*"]
        (listed,) = client.get("/v1/tenant/webhooks", headers=tenant.headers).get_json()[
            "webhooks"]
        assert "secret" not in listed and listed["id"] == created["id"]
        queued = client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        assert queued.status_code == 202
        _deliver(app)
        requests = receiver.wait_for(2)
    events = [json.loads(request["body"]) for request in requests]
    # The endpoint's own creation is an audit entry, and so an event; then the test event.
    assert sorted(event["type"] for event in events) == ["audit.webhook.created", "webhook.test"]
    (test,) = [request for request in requests if b"webhook.test" in request["body"]]
    verified = Webhook(created["secret"]).verify(test["body"], test["headers"])
    assert verified["data"] == {"webhook_id": created["id"]}
    assert test["headers"]["webhook-id"] == queued.get_json()["event_id"]
    # The SDK's receiver helper (sdk/README.md's Flask receiver) accepts it too.
    received = verify_webhook(created["secret"], test["body"], test["headers"])
    assert received["id"] == queued.get_json()["event_id"] and received["type"] == "webhook.test"
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 32).verify(test["body"], test["headers"])
    assert all(entry["delivered"] and entry["state"] == "delivered"
               for entry in _deliveries(client, tenant, created["id"]))


def test_an_event_goes_to_the_endpoints_there_were_when_it_was_raised(app, client, tenant,
                                                                      leak_watch):
    """An endpoint registered after an event was raised, before a worker came round to it,
    does not receive it: only what happens from its registration on."""
    with Receiver() as early, Receiver() as late:
        with time_machine.travel(1_800_000_000, tick=False):
            first = _create(client, tenant, early.url, leak_watch)
        with time_machine.travel(1_800_000_005, tick=False):
            second = _create(client, tenant, late.url, leak_watch)
        _deliver(app)
        to_early, to_late = early.wait_for(2), late.wait_for(1)
    created = [json.loads(request["body"])["data"] for request in to_early]
    assert sorted(data["details"]["webhook_id"] for data in created) == sorted(
        [first["id"], second["id"]])
    (own,) = [json.loads(request["body"])["data"] for request in to_late]
    assert own["details"]["webhook_id"] == second["id"]


def test_a_failed_attempt_is_retried_with_the_same_id_and_both_are_listed(app, client, tenant,
                                                                         leak_watch):
    with Receiver(statuses=[500, 204]) as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        _deliver(app)
        first, second = receiver.wait_for(2)
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"]
    assert first["body"] == second["body"]
    newest, oldest = _deliveries(client, tenant, created["id"])
    assert (oldest["attempt"], oldest["status_code"], oldest["delivered"], oldest["state"]) == \
        (1, 500, False, "retried")
    assert oldest["error"] == "status 500" and oldest["next_attempt_at"] is not None
    assert (newest["attempt"], newest["status_code"], newest["delivered"]) == (2, 204, True)
    assert newest["event_id"] == oldest["event_id"] and newest["type"] == "webhook.test"


def test_an_attempt_the_worker_fails_to_make_is_recorded_failed_and_the_next_event_goes(
        app, client, tenant, leak_watch):
    """An event row the worker cannot read (damaged in the database): its attempts are
    recorded as failed on their schedule, not made again at every lease's end ahead of the
    endpoint's other events."""
    with Receiver() as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        damaged = client.post(f"/v1/tenant/webhooks/{created['id']}/test",
                              headers=tenant.headers).get_json()["event_id"]
        with app.app_context(), unit_of_work():
            db.session.execute(update(WebhookEvent).where(WebhookEvent.id == damaged)
                               .values(data="{not json"))
        sound = client.post(f"/v1/tenant/webhooks/{created['id']}/test",
                            headers=tenant.headers).get_json()["event_id"]
        _deliver(app)
        (arrived,) = receiver.wait_for(1)
    assert arrived["headers"]["webhook-id"] == sound
    attempts = sorted((entry["attempt"], entry["error"], entry["state"])
                      for entry in _deliveries(client, tenant, created["id"])
                      if entry["event_id"] == damaged)
    assert attempts == [(1, delivery.FAILED_TO_ATTEMPT, "retried"),
                        (2, delivery.FAILED_TO_ATTEMPT, "retried"),
                        (3, delivery.FAILED_TO_ATTEMPT, "failed")]


def test_no_attempt_starts_after_sigterm_and_one_claimed_as_it_came_is_let_go(
        app, runner, client, tenant, leak_watch):
    """SIGTERM arrives while the worker leases an attempt (raised from within the claim's
    write, through `flask webhooks deliver`'s own handler): the worker exits without making
    it, and the attempt is due again at once, not held until its lease runs out. Before, the
    handler only started a thread to stop the loop, which made the attempt it had claimed."""
    with Receiver() as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        signalled = []

        def signal_during_the_claim(_connection, _cursor, statement, *_args):
            if not signalled and statement.startswith("UPDATE webhook_deliveries SET "
                                                      "leased_until"):
                signalled.append(statement)
                signal.raise_signal(signal.SIGTERM)

        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        with app.app_context():
            engine = db.engine
        sqlalchemy.event.listen(engine, "before_cursor_execute", signal_during_the_claim)
        try:
            result = runner.invoke(args=["webhooks", "deliver"])
        finally:
            sqlalchemy.event.remove(engine, "before_cursor_execute", signal_during_the_claim)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        assert result.exit_code == 0, result.output
        assert signalled and receiver.requests == []
        with app.app_context():
            (attempt,) = db.session.execute(select(WebhookDelivery)).scalars().all()
            assert (attempt.at, attempt.leased_until, attempt.lease_token) == (None, None, None)
        assert _deliver(app) == 1  # due at once
        assert len(receiver.wait_for(1)) == 1


def test_a_claim_passes_over_an_endpoint_another_transaction_holds(app, client, tenant,
                                                                    leak_watch):
    """An endpoint's row held (a secret rotating, a delete, another worker's claim): its
    attempt waits, and the claim takes the next endpoint's rather than none."""
    if not TEST_DATABASE_URL:
        pytest.skip("PostgreSQL's row locks hold the endpoint")
    with Receiver() as held, Receiver() as free:
        held_id = _create(client, tenant, held.url, leak_watch, events=["usage.threshold"])["id"]
        free_id = _create(client, tenant, free.url, leak_watch, events=["usage.threshold"])["id"]
        for webhook_id in (held_id, free_id):  # the held endpoint's attempt is due first
            client.post(f"/v1/tenant/webhooks/{webhook_id}/test", headers=tenant.headers)
        with app.app_context():
            delivery.dispatch(now_seconds())
        holding = postgresql_connection()
        try:
            holding.cursor().execute(
                "SELECT 1 FROM webhook_endpoints WHERE id = %s FOR NO KEY UPDATE", (held_id,))
            with app.app_context():
                claimed = delivery.claim(now_seconds(), 60)
        finally:
            holding.rollback()
            holding.close()
    assert claimed is not None and claimed[0].endpoint_id == free_id


@pytest.mark.parametrize("claimed_after, overdue", [(10, False), (100, True)])
def test_a_claim_takes_a_tenant_with_no_attempt_in_flight_first(app, client, make_tenant,
                                                                 leak_watch, claimed_after,
                                                                 overdue):
    """One tenant's receivers hang: its attempts hold a worker per endpoint. Another tenant's
    attempt, due later, goes before that tenant's next one, as soon as a worker is free (a
    probe: a healthy receiver's event came 194 s late, behind five 15 s timeouts); unless
    that one is overdue by a minute: a tenant with a busy endpoint is not starved either."""
    slow, other = make_tenant("pro"), make_tenant("pro")
    slow_ids = [_create(client, slow, f"http://127.0.0.1:9/{number}", leak_watch,
                        events=["usage.threshold"])["id"] for number in range(2)]
    other_id = _create(client, other, "http://127.0.0.1:9/other", leak_watch,
                       events=["usage.threshold"])["id"]
    for at, (who, webhook_id) in enumerate(
            [(slow, slow_ids[0]), (slow, slow_ids[1]), (other, other_id)]):
        with time_machine.travel(1_800_000_000 + at, tick=False):  # due in this order
            client.post(f"/v1/tenant/webhooks/{webhook_id}/test", headers=who.headers)
    now = 1_800_000_000 + claimed_after
    with app.app_context():
        delivery.dispatch(now)
        first = delivery.claim(now, 60)[0]  # the slow tenant's, now in flight
        second = delivery.claim(now, 60)[0]
        third = delivery.claim(now, 60)[0]  # no other tenant's left: the slow one's
    in_order = [attempt.endpoint_id for attempt in (first, second, third)]
    assert in_order == ([slow_ids[0], slow_ids[1], other_id] if overdue
                        else [slow_ids[0], other_id, slow_ids[1]])


def test_attempts_go_in_the_events_order_however_the_workers_shared_their_dispatch(
        app, client, tenant, leak_watch):
    """Two workers dispatching at once each take the events the other has not locked: one
    took the first and third, the other the second, a second later. The attempts still go in
    the order the events were raised (they went first, third, second)."""
    if not TEST_DATABASE_URL:
        pytest.skip("PostgreSQL's row locks share the events between the dispatchers")
    with Receiver() as receiver:
        webhook_id = _create(client, tenant, receiver.url, leak_watch,
                             events=["usage.threshold"])["id"]
        raised = [client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                              headers=tenant.headers).get_json()["event_id"] for _ in range(3)]
        holding = postgresql_connection()  # the other worker, in the middle of its dispatch
        try:
            holding.cursor().execute(
                "SELECT 1 FROM webhook_events WHERE id = %s FOR UPDATE", (raised[1],))
            with app.app_context():
                delivery.dispatch(now_seconds())
        finally:
            holding.rollback()
            holding.close()
        with app.app_context():
            assert delivery.dispatch(now_seconds() + 1) == 1  # the second event, left till now
            # One worker makes them, one at a time, in the order it claims them.
            assert delivery.deliver_due(app.config, now=now_seconds() + 1) == 3
        arrived = receiver.wait_for(3)
    assert [request["headers"]["webhook-id"] for request in arrived] == raised


def test_a_claim_waits_for_its_endpoints_first_attempt_rather_than_take_a_later_one(
        app, client, tenant, leak_watch):
    """Another claim, which found the endpoint busy, holds the first attempt's row for a
    moment: the skip-locked scan passed over it, and the claim leased the second event's
    attempt first (CI's scaled-out run)."""
    if not TEST_DATABASE_URL:
        pytest.skip("PostgreSQL's row locks: SQLite serialises the claims")
    webhook_id = _create(client, tenant, "http://127.0.0.1:9/", leak_watch,
                         events=["usage.threshold"])["id"]
    raised = [client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                          headers=tenant.headers).get_json()["event_id"] for _ in range(2)]
    with app.app_context():
        delivery.dispatch(now_seconds())
    holding = postgresql_connection()  # the other claim, before it finds the endpoint busy
    claimed = []
    try:
        holding.cursor().execute(
            "SELECT 1 FROM webhook_deliveries WHERE event_id = %s FOR UPDATE", (raised[0],))

        def claim():
            with app.app_context():
                claimed.append(delivery.claim(now_seconds(), 60)[0].event_id)

        claiming = threading.Thread(target=claim)
        claiming.start()
        wait_for_a_lock_wait(holding.dsn)  # the claim reached the first attempt's row
    finally:
        holding.rollback()
        holding.close()
    claiming.join(timeout=30)
    assert claimed == [raised[0]]


def test_attempts_go_in_the_events_order_when_the_clock_steps_back_between_them(
        app, client, tenant, leak_watch):
    """A time sync or a VM's resume can step the host's clock back a few milliseconds, here
    across a second's boundary between the second event and the third."""
    with Receiver() as receiver:
        webhook_id = _create(client, tenant, receiver.url, leak_watch,
                             events=["usage.threshold"])["id"]
        raised = []
        for at in (1_800_000_000.5, 1_800_000_001.002, 1_800_000_000.998):
            with time_machine.travel(at, tick=False):
                raised.append(client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                                          headers=tenant.headers).get_json()["event_id"])
        assert sorted(raised) == raised
        with app.app_context():
            assert delivery.deliver_due(app.config, now=1_800_000_010) == 3
        arrived = receiver.wait_for(3)
    assert [request["headers"]["webhook-id"] for request in arrived] == raised
    # The payload's timestamp is the event's time: never before the id's own second.
    assert [json.loads(request["body"])["timestamp"] for request in arrived] == [
        "2027-01-15T08:00:00Z", "2027-01-15T08:00:01Z", "2027-01-15T08:00:01Z"]


def test_after_the_last_retry_the_event_is_given_up_and_shown_failed(app, client, tenant,
                                                                     leak_watch):
    with Receiver(statuses=[503]) as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        assert _deliver(app) == 3  # the first attempt and the two retries of the schedule
        assert _deliver(app) == 0
    listed = _deliveries(client, tenant, created["id"])
    assert [entry["attempt"] for entry in listed] == [3, 2, 1]
    assert listed[0]["state"] == "failed" and listed[0]["next_attempt_at"] is None
    page = client.get(f"/v1/tenant/webhooks/{created['id']}/deliveries?limit=1&before="
                      f"{listed[0]['id']}", headers=tenant.headers).get_json()["deliveries"]
    assert [entry["attempt"] for entry in page] == [2]


def test_an_endpoint_deleted_while_its_events_are_dispatched_takes_no_attempt(app, client,
                                                                              tenant,
                                                                              leak_watch):
    """The worker reads a tenant's endpoints, then schedules their first attempts: an endpoint
    deleted in between (DELETE /v1/tenant/webhooks/<id>) must not end the worker with a
    foreign-key violation, which left the outbox undelivered wherever nothing restarts it.
    PostgreSQL: the delete is held open until the dispatch waits for it."""
    if not TEST_DATABASE_URL:
        pytest.skip("PostgreSQL's row locks order the dispatch after the delete")
    created = _create(client, tenant, "http://127.0.0.1:9/hooks", leak_watch,
                      events=["usage.threshold"])
    client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
    deleting = postgresql_connection()
    outcome = []

    def dispatch():
        with app.app_context():
            try:
                outcome.append(delivery.dispatch(now_seconds()))
            except Exception as exc:  # noqa: BLE001 - the assertion below names it
                outcome.append(exc)

    try:
        deleting.cursor().execute("DELETE FROM webhook_endpoints WHERE id = %s",
                                  (created["id"],))
        dispatching = threading.Thread(target=dispatch)
        dispatching.start()
        wait_for_a_lock_wait(deleting.dsn)  # the dispatch reached the endpoint being deleted
        deleting.commit()
        dispatching.join(timeout=30)
    finally:
        deleting.close()
    assert outcome == [2], outcome  # the endpoint's creation (an audit event) and the test
    with app.app_context():
        assert db.session.query(WebhookDelivery).count() == 0
        assert db.session.query(WebhookEvent).filter(
            WebhookEvent.dispatched_at.is_(None)).count() == 0


def test_redirects_are_not_followed(app, client, tenant, leak_watch):
    with Receiver() as target, Receiver(statuses=[302], location=None) as receiver:
        receiver.location = target.url
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        _deliver(app)
        assert len(receiver.requests) == 3 and target.requests == []
    first = _deliveries(client, tenant, created["id"])[-1]
    assert (first["status_code"], first["error"]) == (302, "redirect not followed")


def test_a_2xx_whose_body_then_stalls_is_delivered(app, client, tenant, leak_watch):
    """CONTRACT.md: a 2xx within 15 s is delivered, and at most 4 KiB of the answer is read. A
    receiver that answers 200 at once and never finishes the body it announced has answered:
    recorded as delivered when the deadline cuts the body short, not retried as a failure."""
    app.config["WEBHOOK_TIMEOUT"] = 1.0
    with Receiver(statuses=[200], stall_body=True) as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        _deliver(app)
        assert len(receiver.wait_for(1)) == 1
    (attempt,) = _deliveries(client, tenant, created["id"])
    assert (attempt["status_code"], attempt["delivered"], attempt["error"]) == (200, True, None)


def test_a_rotated_secret_signs_beside_the_previous_one_during_the_grace(app, client, tenant,
                                                                        leak_watch):
    with Receiver() as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        rotated = client.post(f"/v1/tenant/webhooks/{created['id']}/rotate-secret",
                              headers=tenant.headers, json={"grace_seconds": 3600})
        assert rotated.status_code == 200 and rotated.headers["Cache-Control"] == "no-store"
        new_secret = rotated.get_json()["secret"]
        leak_watch.add(new_secret)
        assert new_secret != created["secret"] and rotated.get_json()["previous_valid_until"]
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        _deliver(app)
        (request,) = receiver.wait_for(1)
        assert len(request["headers"]["webhook-signature"].split(" ")) == 2
        for secret in (created["secret"], new_secret):
            Webhook(secret).verify(request["body"], request["headers"])
        # Without a grace the previous secret stops signing at once.
        again = client.post(f"/v1/tenant/webhooks/{created['id']}/rotate-secret",
                            headers=tenant.headers).get_json()
        leak_watch.add(again["secret"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        _deliver(app)
        request = receiver.wait_for(2)[1]
    assert len(request["headers"]["webhook-signature"].split(" ")) == 1
    Webhook(again["secret"]).verify(request["body"], request["headers"])
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret).verify(request["body"], request["headers"])


def test_rotating_a_secret_no_key_unseals_gives_it_no_grace(app, client, tenant, leak_watch):
    """Kept for a grace, a secret no key of the ring unseals failed every attempt of the
    grace, the new secret's signature with it."""
    with Receiver() as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        with app.app_context():
            db.session.execute(update(WebhookEndpoint).values(
                secret_sealed=Fernet(Fernet.generate_key()).encrypt(b"whsec_gone").decode()))
            db.session.commit()
        rotated = client.post(f"/v1/tenant/webhooks/{created['id']}/rotate-secret",
                              headers=tenant.headers, json={"grace_seconds": 3600}).get_json()
        leak_watch.add(rotated["secret"])
        assert rotated["previous_valid_until"] is None
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        assert _deliver(app) == 1
        (request,) = receiver.wait_for(1)
    Webhook(rotated["secret"]).verify(request["body"], request["headers"])


def test_a_secret_the_worker_cannot_unseal_fails_that_attempt_and_the_others_go_on(
        app, client, tenant, make_tenant, runner, leak_watch):
    """An operator's CLI ran with a newer key ring than the worker's: that endpoint's attempt
    fails and is retried on the schedule, every other tenant's is delivered."""
    app.config["WEBHOOK_RETRY_DELAYS"] = (60,)
    worker_ring = app.config["SECRET_ENCRYPTION_KEY"]
    newer_ring = f"{Fernet.generate_key().decode()},{worker_ring}"
    other = make_tenant("starter")
    with Receiver() as receiver:
        readable = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        app.config["SECRET_ENCRYPTION_KEY"] = newer_ring
        result = runner.invoke(args=["webhooks", "create", other.email, receiver.url,
                                     "--event", "usage.threshold"])
        sealed_elsewhere = json.loads(result.stdout)
        leak_watch.add(sealed_elsewhere["secret"])
        app.config["SECRET_ENCRYPTION_KEY"] = worker_ring
        for owner, webhook in ((other, sealed_elsewhere), (tenant, readable)):
            client.post(f"/v1/tenant/webhooks/{webhook['id']}/test", headers=owner.headers)
        assert _deliver(app) == 2
        (request,) = receiver.requests
        Webhook(readable["secret"]).verify(request["body"], request["headers"])
        retry, failed = _deliveries(client, other, sealed_elsewhere["id"])
        assert (failed["state"], failed["status_code"]) == ("retried", None)
        assert failed["error"] == "the delivery worker cannot unseal the endpoint's secret"
        # A worker with the newer ring makes the retry when it is due.
        app.config["SECRET_ENCRYPTION_KEY"] = newer_ring
        with app.app_context():
            assert delivery.deliver_due(app.config, now=retry["next_attempt_at"]) == 1
        request = receiver.wait_for(2)[1]
    Webhook(sealed_elsewhere["secret"]).verify(request["body"], request["headers"])
    lines = [json.loads(line) for line in leak_watch.buffer.getvalue().splitlines()]
    (logged,) = [line for line in lines if "cannot be unsealed" in line["message"]]
    assert logged["level"] == "ERROR"
    assert (logged["tenant_id"], logged["webhook_id"]) == (other.tenant_id,
                                                           sealed_elsewhere["id"])


@pytest.mark.parametrize("url, error", [
    ("http://203.0.113.10/hooks", "url must be an https:// URL"),
    ("https://127.0.0.1/hooks", "url must point to a public address"),
    ("https://10.1.2.3/hooks", "url must point to a public address"),
    ("https://[::1]/hooks", "url must point to a public address"),
    ("https://[::ffff:192.168.0.1]/hooks", "url must point to a public address"),
    ("https://169.254.169.254/latest", "url must point to a public address"),
    # IPv6 forms that reach an IPv4 address: NAT64, local-use NAT64, IPv4-compatible, SIIT.
    ("https://[64:ff9b::a9fe:a9fe]/latest", "url must point to a public address"),
    ("https://[64:ff9b::7f00:1]/hooks", "url must point to a public address"),
    ("https://[64:ff9b:1::5db8:d70e]/hooks", "url must point to a public address"),
    ("https://[::7f00:1]/hooks", "url must point to a public address"),
    ("https://[::ffff:0:a00:1]/hooks", "url must point to a public address"),
    ("https://[2002:a9fe:a9fe::]/hooks", "url must point to a public address"),
    ("https://192.0.0.8/hooks", "url must point to a public address"),
    ("https://[fec0::1]/hooks", "url must point to a public address"),  # site-local
    # Not global, though Python 3.11's ipaddress says they are: 6to4 relay anycast,
    # documentation (RFC 9637) and SRv6 segment identifiers.
    ("https://192.88.99.1/hooks", "url must point to a public address"),
    ("https://[3fff::1]/hooks", "url must point to a public address"),
    ("https://[5f00::1]/hooks", "url must point to a public address"),
    ("https://localhost/hooks", "url must point to a public address"),
    ("https://user:pw@93.184.215.14/hooks", ssrf.CREDENTIALS),
    ("https://token@93.184.215.14/hooks", ssrf.CREDENTIALS),
    ("https:///hooks", "url must be an absolute URL with a host"),
    ("ftp://93.184.215.14/hooks", "url must be an https:// URL"),
    ("https://93.184.215.14:0/hooks", "url's port must be between 1 and 65535"),
    ("https://93.184.215.14:99999/hooks", "url's port must be between 1 and 65535"),
    ("https://[2606:4700::1111]:65536/hooks", "url's port must be between 1 and 65535"),
    ("https://93.184.215.14:8x/hooks", "url must be an absolute URL with a host"),
])
def test_private_addresses_and_plain_http_are_refused_without_the_setting(
        app, client, tenant, url, error):
    app.config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] = False
    assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers,
                                json={"url": url}), 400, error)


def test_a_public_https_url_is_accepted_without_the_setting(app, client, tenant, leak_watch):
    app.config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] = False
    _create(client, tenant, "https://93.184.215.14/hooks", leak_watch)
    # A public IPv4 address through NAT64 is as public as the address itself.
    _create(client, tenant, "https://[64:ff9b::5db8:d70e]/hooks", leak_watch)


def test_the_address_is_checked_again_at_each_connection(app, client, tenant, leak_watch):
    """Registered while allowed (or while the name resolved elsewhere): the worker without the
    setting refuses to connect, and the receiver hears nothing."""
    with Receiver() as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        app.config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] = False
        _deliver(app)
        assert receiver.requests == []
    first = _deliveries(client, tenant, created["id"])[-1]
    assert first["error"] == "url must be an https:// URL" and first["status_code"] is None


def test_an_ipv6_form_of_a_private_address_is_refused_at_connection_too(app, client, tenant,
                                                                        leak_watch):
    created = _create(client, tenant, "https://[64:ff9b::7f00:1]/hooks", leak_watch,
                      events=["usage.threshold"])
    client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
    app.config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] = False
    _deliver(app)
    first = _deliveries(client, tenant, created["id"])[-1]
    assert first["error"] == "url must point to a public address" and first["status_code"] is None


@pytest.mark.parametrize("url", ["http://127.0.0.1:8714/o k", "http://127.0.0.1:8714/hooks?a=b c",
                                 "http://127.0.0.1:8714/caf\u00e9"])
def test_a_url_no_request_line_can_carry_is_refused(client, tenant, url):
    body = assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers,
                                       json={"url": url}), 400, NOT_ENCODED)
    assert body["details"] == {"url": [NOT_ENCODED]}


@pytest.mark.parametrize("url", [" http://127.0.0.1:8714/hooks", "http://127.0.0.1:8714/hooks ",
                                 "\u00a0http://127.0.0.1:8714/hooks"])
def test_a_url_with_spaces_around_it_is_refused(client, tenant, url):
    """Spaces before the scheme are dropped by the URL parser: such a URL was stored and listed
    with them, and called without."""
    body = assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers,
                                       json={"url": url}), 400, ssrf.SURROUNDED)
    assert body["details"] == {"url": [ssrf.SURROUNDED]}


def test_a_stored_url_no_request_line_can_carry_fails_its_attempts(app, client, tenant,
                                                                   leak_watch):
    """Registered before the rule: each attempt says why, and the worker goes on."""
    created = _create(client, tenant, "http://127.0.0.1:8714/hooks", leak_watch,
                      events=["usage.threshold"])
    with app.app_context(), unit_of_work():
        db.session.execute(update(WebhookEndpoint).where(WebhookEndpoint.id == created["id"])
                           .values(url="http://127.0.0.1:8714/caf\u00e9"))
    client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
    assert _deliver(app) == 3
    assert {entry["error"] for entry in _deliveries(client, tenant, created["id"])} == {
        NOT_ENCODED}


def test_at_most_five_endpoints_and_deleting_one_makes_room(client, tenant, leak_watch):
    ids = [_create(client, tenant, f"https://93.184.215.14/{n}", leak_watch)["id"]
           for n in range(5)]
    assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers,
                                json={"url": "https://93.184.215.14/6"}), 409,
                    "a tenant holds at most 5 webhook endpoints: delete one first")
    assert client.delete(f"/v1/tenant/webhooks/{ids[0]}", headers=tenant.headers).status_code \
        == 200
    assert_envelope(client.delete(f"/v1/tenant/webhooks/{ids[0]}", headers=tenant.headers),
                    404, "webhook not found")
    _create(client, tenant, "https://93.184.215.14/6", leak_watch)


@pytest.mark.parametrize("events", [["usage.thresholds"], [None]])
def test_unknown_event_types_are_refused(client, tenant, events):
    body = assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers, json={
        "url": "https://93.184.215.14/x", "events": events}), 400)
    assert "events" in body["details"] and "may not be null" not in json.dumps(body)


def test_details_name_each_field_with_its_messages_as_the_contract_shapes_them(client, tenant):
    """`{"<field>": ["<message>", ...]}`: a list's bad items under the list's own name, once,
    not keyed by index ({"events": {"0": [...], "1": [...]}}); a nested object's fields by
    their path."""
    body = assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers, json={
        "url": "https://93.184.215.14/x", "events": ["nope", "nor-this"]}), 400)
    (message,) = body["details"]["events"]
    assert list(body["details"]) == ["events"] and message.startswith("events must name")
    body = assert_envelope(client.post("/v1/intent/verify", headers=tenant.headers, json={
        "original_intent_hash": "sha256:" + "0" * 64, "response": {"match_id": 5}}), 400)
    assert all(isinstance(messages, list) and all(isinstance(text, str) for text in messages)
               for messages in body["details"].values())
    assert "response.match_id" in body["details"]


@pytest.mark.parametrize("event_type", ["audit.key.created", "audit.api_key.create",
                                        "api_key.created", "audit.anything.at_all"])
def test_an_audit_action_the_log_never_records_is_refused(client, tenant, event_type):
    """A misspelt audit action would be a subscription that never receives anything."""
    body = assert_envelope(client.post("/v1/tenant/webhooks", headers=tenant.headers, json={
        "url": "https://93.184.215.14/x", "events": [event_type]}), 400)
    assert "events" in body["details"]


def test_every_audit_action_recorded_is_one_an_endpoint_may_subscribe_to():
    source = "\n".join(path.read_text() for path in Path(ROOT, "app").rglob("*.py"))
    recorded = set(re.findall(r'audit\.record\(\s*[\w.]+,\s*"([a-z_.]+)"', source))
    recorded |= set(re.findall(r'"([a-z_]+\.[a-z_]+)" if active else "([a-z_]+\.[a-z_]+)"',
                               source)[0])
    assert len(recorded) == len(events.AUDIT_ACTIONS)
    assert recorded == set(events.AUDIT_ACTIONS)


def test_the_audit_log_refuses_an_action_missing_from_the_list(app, tenant):
    with app.app_context(), pytest.raises(ValueError, match="AUDIT_ACTIONS"):
        audit.record(tenant.tenant_id, "key.created")


def test_usage_alerts_default_and_set(client, tenant):
    assert client.get("/v1/tenant/usage-alerts", headers=tenant.headers).get_json() == {
        "thresholds": [80, 100]}
    answer = client.put("/v1/tenant/usage-alerts", headers=tenant.headers,
                        json={"thresholds": [95, 50, 80, 100]})
    assert answer.status_code == 200 and answer.get_json() == {"thresholds": [50, 80, 95, 100]}
    for thresholds in ([], [0], [101], [1, 2, 3, 4, 5, 6], ["80"], [True], [None]):
        body = assert_envelope(client.put("/v1/tenant/usage-alerts", headers=tenant.headers,
                                          json={"thresholds": thresholds}), 400)
        assert "may not be null" not in json.dumps(body)
    entries = client.get("/v1/tenant/audit-log", headers=tenant.headers).get_json()["entries"]
    assert entries[0]["action"] == "usage_alerts.changed"


def test_the_admin_api_manages_any_tenants_webhooks(app, client, tenant, runner, leak_watch):
    result = runner.invoke(args=["admin-keys", "create", "--name", "ops", "--json"])
    admin_key = json.loads(result.stdout)["api_key"]
    leak_watch.add(admin_key)
    headers = {"X-Service-Key": admin_key}
    base = f"/v1/admin/tenants/{tenant.tenant_id}"
    created = client.post(base + "/webhooks", headers=headers,
                          json={"url": "https://93.184.215.14/admin"})
    assert created.status_code == 201, created.get_json()
    leak_watch.add(created.get_json()["secret"])
    listed = client.get("/v1/tenant/webhooks", headers=tenant.headers).get_json()["webhooks"]
    assert [row["id"] for row in listed] == [created.get_json()["id"]]
    assert client.put(base + "/usage-alerts", headers=headers,
                      json={"thresholds": [90]}).get_json() == {"thresholds": [90]}


@pytest.mark.parametrize("method, operation", [
    ("delete", ""), ("post", "/rotate-secret"), ("post", "/test"), ("get", "/deliveries")])
def test_an_unknown_tenant_on_the_admin_path_is_tenant_not_found(client, runner, leak_watch,
                                                                 method, operation):
    result = runner.invoke(args=["admin-keys", "create", "--name", "ops", "--json"])
    admin_key = json.loads(result.stdout)["api_key"]
    leak_watch.add(admin_key)
    response = getattr(client, method)(f"/v1/admin/tenants/999999/webhooks/wh_x{operation}",
                                       headers={"X-Service-Key": admin_key})
    assert_envelope(response, 404, "tenant not found")


def test_an_audit_entry_is_an_event_and_never_carries_a_secret(app, client, tenant, leak_watch):
    with Receiver() as receiver:
        _create(client, tenant, receiver.url, leak_watch, events=["audit.*"])
        created = client.post("/v1/tenant/keys", headers=tenant.headers, json={"name": "ci"})
        leak_watch.add(created.get_json()["api_key"])
        rotated = client.post("/v1/tenant/signing-secret/rotate", headers=tenant.headers,
                              json={})
        leak_watch.add(rotated.get_json()["signing_secret"])
        _deliver(app)
        receiver.wait_for(3)
    types = [event["type"] for event in receiver.events()]
    assert types == ["audit.webhook.created", "audit.api_key.created",
                     "audit.signing_secret.rotated"]
    key_event = receiver.events()[1]["data"]
    assert key_event["details"]["key_id"] == created.get_json()["id"]
    assert key_event["actor"].startswith("key:") and "api_key" not in key_event["details"]
    # leak_watch checks the bodies received too: no key or secret in any of them.
    assert leak_watch.leaks_in(b"".join(r["body"] for r in receiver.requests).decode()) == []


def test_deliveries_are_purged_with_the_intents_after_30_days(app, client, tenant, runner,
                                                              leak_watch):
    import time_machine

    with Receiver() as receiver:
        with time_machine.travel(1_700_000_000, tick=False):
            created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
            client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
            _deliver(app)
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        _deliver(app)
    assert len(_deliveries(client, tenant, created["id"])) == 2
    result = runner.invoke(args=["intents", "purge"])  # now: more than 30 days after the first
    # The old test event and the endpoint's audit event (raised, received by no one).
    assert "webhooks: 1 delivery attempts and 2 events deleted" in result.output, result.output
    (kept,) = _deliveries(client, tenant, created["id"])
    assert kept["delivered"]


def test_api_key_expiring_is_raised_7_days_and_1_day_before_once_each(app, client, tenant,
                                                                       leak_watch):
    with Receiver() as receiver:
        _create(client, tenant, receiver.url, leak_watch, events=["api_key.expiring"])
        created = client.post("/v1/tenant/keys", headers=tenant.headers,
                              json={"name": "short", "expires_in": 10 * 86400}).get_json()
        leak_watch.add(created["api_key"])
        import time_machine

        now = created["created_at"]
        with app.app_context():
            for moment in (now, now + 3 * 86400 + 1, now + 3 * 86400 + 2, now + 9 * 86400 + 1,
                           now + 9 * 86400 + 2):
                with time_machine.travel(moment, tick=False):
                    delivery.raise_expiring_keys(moment)
            delivery.deliver_due(app.config)
        receiver.wait_for(2)
    assert [event["data"] for event in receiver.events()] == [
        {"key_id": created["id"], "expires_at": created["expires_at"]}] * 2
    assert all(event["type"] == "api_key.expiring" for event in receiver.events())


def test_metrics_count_attempts_by_outcome_and_the_oldest_pending_one(app, client, tenant,
                                                                      leak_watch):
    app.config.update(METRICS_ENABLED=True, WEBHOOK_RETRY_DELAYS=(0,))
    with Receiver(statuses=[500]) as receiver:
        created = _create(client, tenant, receiver.url, leak_watch, events=["usage.threshold"])
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
        with app.app_context():
            delivery.dispatch(0)  # two attempts due since the epoch, none made yet
        text = client.get("/metrics").get_data(as_text=True)
        assert "intentgate_webhook_oldest_pending_seconds 1." in text
        _deliver(app)
    text = client.get("/metrics").get_data(as_text=True)
    assert 'intentgate_webhook_attempts{outcome="retried"} 2.0' in text
    assert 'intentgate_webhook_attempts{outcome="failed"} 2.0' in text
    assert 'intentgate_webhook_attempts{outcome="delivered"} 0.0' in text
    assert "intentgate_webhook_oldest_pending_seconds 0.0" in text


def test_the_oldest_pending_age_counts_events_no_worker_has_taken_yet(app, client, tenant,
                                                                      leak_watch):
    """With no delivery worker running at all, events wait in the outbox and no attempt row
    exists: the age the alert watches must grow all the same."""
    app.config.update(METRICS_ENABLED=True)
    created = _create(client, tenant, "http://127.0.0.1:9/hooks", leak_watch,
                      events=["usage.threshold"])
    client.post(f"/v1/tenant/webhooks/{created['id']}/test", headers=tenant.headers)
    with app.app_context(), unit_of_work():
        db.session.execute(update(WebhookEvent).values(created_at=now_seconds() - 600))
    text = client.get("/metrics").get_data(as_text=True)
    (age,) = [float(line.split()[1]) for line in text.splitlines()
              if line.startswith("intentgate_webhook_oldest_pending_seconds ")]
    assert 600 <= age < 660  # not 0


# -- One deadline for the whole attempt: resolving and connecting count too -------------------

@pytest.fixture
def unanswering_address():
    """An address whose connections wait for ever: a listener with a full accept queue (the
    kernel drops further SYNs, as a firewall that drops packets would)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        queued.append(filler)
    yield listener.getsockname()
    for sock in [listener, *queued]:
        sock.close()


def test_a_host_of_many_addresses_that_do_not_answer_is_cut_at_the_deadline(
        monkeypatch, unanswering_address):
    """Each address is tried for the connect timeout, but not past the attempt's deadline:
    eight of them took 8 s against a 2 s deadline, and enough outlasted the lease."""
    host, port = unanswering_address
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (host, port))] * 8)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        ssrf.post(f"http://receiver.example:{port}/hook", b"{}", {}, True, 1, 2)
    assert time.monotonic() - started < 6


def test_a_name_that_does_not_resolve_in_time_is_cut_at_the_deadline(monkeypatch):
    resolving = threading.Event()

    def hanging(*args, **kwargs):
        resolving.set()
        time.sleep(10)
        raise socket.gaierror("too late")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        ssrf.post("http://receiver.example/hook", b"{}", {}, True, 1, 2)
    assert resolving.is_set() and time.monotonic() - started < 6


def test_a_move_to_a_limited_plan_raises_the_alerts_the_month_has_reached(app, client,
                                                                          make_tenant,
                                                                          admin_headers):
    """A downgrade can put the month past its alerts at once, and no verification will cross
    them this month (the refused ones count nothing): the move raises them, each once."""
    tenant = make_tenant("pro")
    with app.app_context(), unit_of_work():
        db.session.add(MonthlyUsage(tenant_id=tenant.tenant_id, period=billing_period(),
                                    shard=0, usage_count=1_200))

    def raised():
        with app.app_context():
            return sorted((json.loads(row.data) for row in db.session.scalars(
                select(WebhookEvent).where(WebhookEvent.tenant_id == tenant.tenant_id,
                                           WebhookEvent.type == "usage.threshold"))),
                          key=lambda data: data["threshold"])

    for plan in ("free", "starter", "free"):
        answer = client.patch(f"/v1/admin/tenants/{tenant.tenant_id}", headers=admin_headers,
                              json={"plan": plan})
        assert answer.status_code == 200, answer.get_json()
        # The starter plan's 80 % (40,000) is not reached; back on free, none is raised again.
        assert raised() == [{"period": billing_period(), "rate_limit": 1_000,
                             "threshold": threshold, "usage_count": 1_200}
                            for threshold in (80, 100)]


NODE_RECEIVER = r"""
const { verifyWebhook } = require('./index.js');
const { secret, deliveries } = JSON.parse(require('fs').readFileSync(0, 'utf8'));
process.stdout.write(JSON.stringify(deliveries.map(({ body, headers }) => {
  try { return verifyWebhook(secret, Buffer.from(body, 'base64'), headers); }
  catch (error) { return error.name; }
})));
"""


def test_the_node_sdk_verifies_what_the_service_signs():
    """The Node SDK's verifyWebhook against the service's own signatures: one secret, both of a
    rotation's, and a body changed after signing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node receiver is not checked here")
    old, new = signatures.new_secret(), signatures.new_secret()
    body = json.dumps({"type": "webhook.test", "timestamp": "2026-11-27T04:00:00Z",
                       "data": {"webhook_id": "we_1", "note": "caf\u00e9 \u2028"}},
                      ensure_ascii=False).encode("utf-8")
    now = now_seconds()
    deliveries = [{"body": base64.b64encode(body).decode(),
                   "headers": signatures.headers(secrets_in_force, "msg_1", now, body)}
                  for secrets_in_force in ([new], [new, old], [old])]
    deliveries.append({"body": base64.b64encode(body.replace(b"we_1", b"we_2")).decode(),
                       "headers": deliveries[0]["headers"]})
    finished = subprocess.run([node, "-e", NODE_RECEIVER], cwd=ROOT / "sdk" / "js",
                              input=json.dumps({"secret": new, "deliveries": deliveries}),
                              capture_output=True, text=True, timeout=60, check=True)
    event = {"id": "msg_1", **json.loads(body)}
    assert json.loads(finished.stdout) == [event, event, "WebhookVerificationError",
                                           "WebhookVerificationError"]


def test_a_tls_handshake_that_drips_in_is_cut_at_the_deadline(monkeypatch, unanswering_address):
    """The first address never answers (3 s of the 4 s deadline gone), the second accepts and
    then sends its TLS handshake a byte at a time: the handshake must end with the attempt's
    deadline, not get a whole timeout of its own (7 s in all)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip():
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"\x16\x03\x03\x3e\x80")  # a handshake record of 16,000 bytes
            while not stop.wait(0.5):
                try:
                    connection.sendall(b"\x00")
                except OSError:
                    return

    threading.Thread(target=drip, daemon=True).start()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", unanswering_address),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", listener.getsockname())])
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            ssrf.post("https://receiver.example/hook", b"{}", {}, True, 3, 4)
        assert time.monotonic() - started < 5.5
    finally:
        stop.set()
        listener.close()
