"""Webhook guarantees that are about processes: the gate's usage.threshold under concurrent
verifies across gunicorn workers, and delivery workers killed, stopped or racing each other.
Runs on the suite's database, SQLite or PostgreSQL (TEST_DATABASE_URL)."""
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sqlalchemy import func, select, text
from standardwebhooks import Webhook, WebhookVerificationError

from app.clock import billing_period
from app.extensions import db
from app.sql import unit_of_work
from app.tenants.models import MonthlyUsage
from app.webhooks import delivery
from app.webhooks.models import WebhookDelivery, WebhookEvent
from tests.conftest import ENCRYPTION_KEY, TEST_DATABASE_URL, TEST_REDIS_URL
from tests.receivers import DeliveryWorker, Receiver
from tests.servers import GunicornServer

WORKER_SETTINGS = {"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_POLL_SECONDS": "0.1",
                   "WEBHOOK_TIMEOUT": "3", "WEBHOOK_LEASE_SECONDS": "4",
                   "WEBHOOK_RETRY_DELAYS": "0,0"}


@pytest.fixture
def settings(settings):
    settings.update(WEBHOOK_ALLOW_PRIVATE_ADDRESSES=True, WEBHOOK_RETRY_DELAYS=(0, 0))
    return settings


@pytest.fixture
def environment(base_settings):
    return {"DATABASE_URL": base_settings["SQLALCHEMY_DATABASE_URI"],
            "SECRET_ENCRYPTION_KEY": ENCRYPTION_KEY, "REDIS_URL": TEST_REDIS_URL or ""}


@pytest.fixture
def workers(tmp_path, environment, leak_watch):
    started = []

    def start(**settings):
        worker = DeliveryWorker(tmp_path / f"worker-{len(started)}.log",
                                {**environment, **WORKER_SETTINGS, **settings})
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.stop()
        assert leak_watch.leaks_in(worker.log_path.read_text(errors="replace")) == []


def _endpoint(client, tenant, url, leak_watch):
    created = client.post("/v1/tenant/webhooks", headers=tenant.headers,
                          json={"url": url, "events": ["usage.threshold"]})
    assert created.status_code == 201, created.get_json()
    leak_watch.add(created.get_json()["secret"])
    return created.get_json()["id"]


def _wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.05)


def _attempts(app, tenant):
    with app.app_context():
        return db.session.execute(
            select(WebhookDelivery.event_id, WebhookDelivery.attempt, WebhookDelivery.delivered)
            .where(WebhookDelivery.tenant_id == tenant.tenant_id)).all()


def test_a_worker_killed_mid_attempt_loses_nothing(app, client, tenant, workers, leak_watch):
    with Receiver() as receiver:
        webhook_id = _endpoint(client, tenant, receiver.url, leak_watch)
        release = receiver.hold = threading.Event()  # the first attempt hangs till released
        event_id = client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                               headers=tenant.headers).get_json()["event_id"]
        first = workers()
        assert len(receiver.wait_for(1)) == 1
        first.stop(signal.SIGKILL)
        release.set()
        second = workers()  # its lease on the attempt runs out, and the attempt is made again
        requests_ = receiver.wait_for(2, timeout=30)
        # The receiver has the request before the worker records its answer; a stopped worker
        # has finished the attempt in flight, so the record is read after that, not raced.
        assert second.stop() == 0
    assert [request["headers"]["webhook-id"] for request in requests_] == [event_id, event_id]
    assert _attempts(app, tenant) == [(event_id, 1, True)]


def test_sigterm_finishes_the_attempt_in_flight(app, client, tenant, workers, leak_watch):
    with Receiver() as receiver:
        webhook_id = _endpoint(client, tenant, receiver.url, leak_watch)
        release = receiver.hold = threading.Event()
        event_id = client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                               headers=tenant.headers).get_json()["event_id"]
        worker = workers()
        receiver.wait_for(1)
        worker.process.send_signal(signal.SIGTERM)
        release.set()
        assert worker.process.wait(30) == 0
    assert _attempts(app, tenant) == [(event_id, 1, True)]
    assert len(receiver.requests) == 1


def test_a_worker_waits_out_a_database_that_drops_its_connections(
        app, client, tenant, workers, environment, leak_watch):
    """A PostgreSQL restart or failover ends every connection: the worker must go on with new
    ones, as gunicorn's workers do, not exit and leave the outbox undelivered."""
    if not TEST_DATABASE_URL:
        pytest.skip("needs PostgreSQL (TEST_DATABASE_URL) to end a worker's connections")
    name = "webhook-worker-" + uuid.uuid4().hex[:8]
    separator = "&" if "?" in environment["DATABASE_URL"] else "?"
    environment["DATABASE_URL"] += f"{separator}application_name={name}"
    with Receiver() as receiver:
        webhook_id = _endpoint(client, tenant, receiver.url, leak_watch)
        worker = workers()
        first = client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                            headers=tenant.headers).get_json()["event_id"]
        assert len(receiver.wait_for(1, timeout=30)) == 1
        # Once the attempt is recorded: cut before that, it would be made again when its lease
        # ran out (at least once), ahead of the event below.
        _wait_until(lambda: _attempts(app, tenant) == [(first, 1, True)])
        with app.app_context():
            ended = db.session.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :name"), {"name": name}).scalar()
            db.session.rollback()
        assert ended >= 1
        event_id = client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                               headers=tenant.headers).get_json()["event_id"]
        requests_ = receiver.wait_for(2, timeout=30)
        assert worker.process.poll() is None, "the worker exited"
        assert worker.stop() == 0
    assert requests_[-1]["headers"]["webhook-id"] == event_id
    assert "database unavailable" in worker.log_path.read_text()


def test_two_workers_on_one_outbox_make_each_attempt_once(app, client, tenant, workers,
                                                          leak_watch):
    with Receiver() as receiver:
        webhook_id = _endpoint(client, tenant, receiver.url, leak_watch)
        event_ids = {client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                                 headers=tenant.headers).get_json()["event_id"]
                     for _ in range(20)}
        racing = [workers(), workers()]
        receiver.wait_for(20, timeout=60)
        for worker in racing:
            assert worker.stop() == 0
    received = [request["headers"]["webhook-id"] for request in receiver.requests]
    assert sorted(received) == sorted(event_ids)  # each once, none lost
    assert sorted(_attempts(app, tenant)) == sorted((event_id, 1, True) for event_id in event_ids)


# An attempt may take this long, far longer than the waits below: an attempt still in flight is
# one its receiver holds, not one the worker gave up on.
PATIENT = {"WEBHOOK_TIMEOUT": "60", "WEBHOOK_LEASE_SECONDS": "90"}


def test_an_endpoint_slow_to_answer_holds_one_worker_and_the_other_goes_on(
        app, client, tenant, make_tenant, workers, leak_watch):
    """Three events for an endpoint that does not answer, then one for another tenant's: one
    worker is held by the first attempt, and the other passes over the slow endpoint's next
    ones (it has one in flight) to deliver the other tenant's event."""
    other = make_tenant("starter")
    with Receiver() as slow, Receiver() as prompt:
        slow_id = _endpoint(client, tenant, slow.url, leak_watch)
        prompt_id = _endpoint(client, other, prompt.url, leak_watch)
        release = slow.hold = threading.Event()
        for _ in range(3):
            client.post(f"/v1/tenant/webhooks/{slow_id}/test", headers=tenant.headers)
        racing = [workers(**PATIENT)]
        try:
            assert len(slow.wait_for(1)) == 1  # the first worker is in that attempt, held
            event_id = client.post(f"/v1/tenant/webhooks/{prompt_id}/test",
                                   headers=other.headers).get_json()["event_id"]
            racing.append(workers(**PATIENT))
            arrived = prompt.wait_for(1, timeout=20)
            assert len(slow.requests) == 1
        finally:
            release.set()
        slow.wait_for(3)
        for worker in racing:
            assert worker.stop() == 0
    assert [request["headers"]["webhook-id"] for request in arrived] == [event_id]


def test_an_endpoint_has_one_attempt_in_flight_at_a_time(app, client, tenant, workers,
                                                         leak_watch):
    """Across workers, so that one endpoint, however slow, holds one of them, not all."""
    with Receiver() as receiver:
        webhook_id = _endpoint(client, tenant, receiver.url, leak_watch)
        release = receiver.hold = threading.Event()
        event_ids = [client.post(f"/v1/tenant/webhooks/{webhook_id}/test",
                                 headers=tenant.headers).get_json()["event_id"]
                     for _ in range(3)]
        racing = [workers(**PATIENT), workers(**PATIENT)]
        try:
            assert len(receiver.wait_for(1)) == 1
            # The other worker is free and the two other attempts due: neither is made while
            # the first is in flight. Then they are made in the events' order.
            assert len(receiver.wait_for(2, timeout=2)) == 1
        finally:
            release.set()
        requests_ = receiver.wait_for(3)
        for worker in racing:
            assert worker.stop() == 0
    assert [request["headers"]["webhook-id"] for request in requests_] == event_ids
    assert sorted(_attempts(app, tenant)) == sorted((event_id, 1, True) for event_id in event_ids)


def test_a_running_worker_signs_with_the_secrets_in_force_at_each_attempt(
        app, client, tenant, workers, leak_watch):
    """The worker's session lives as long as the worker: a rotation made while it runs must
    still reach its next attempt's signature, without a restart."""
    with Receiver() as receiver:
        created = client.post("/v1/tenant/webhooks", headers=tenant.headers,
                              json={"url": receiver.url, "events": ["usage.threshold"]})
        first = created.get_json()["secret"]
        leak_watch.add(first)
        base = f"/v1/tenant/webhooks/{created.get_json()['id']}"

        def rotate(**body):
            secret = client.post(base + "/rotate-secret", headers=tenant.headers,
                                 json=body).get_json()["secret"]
            leak_watch.add(secret)
            return secret

        def attempt(count):
            client.post(base + "/test", headers=tenant.headers)
            requests_ = receiver.wait_for(count, timeout=30)
            assert len(requests_) == count
            return requests_[-1]

        worker = workers()
        attempt(1)  # the worker has read the endpoint once
        graced = rotate(grace_seconds=3600)
        in_grace = attempt(2)
        current = rotate()
        after = attempt(3)
        assert worker.stop() == 0
    assert len(in_grace["headers"]["webhook-signature"].split(" ")) == 2
    for secret in (first, graced):
        Webhook(secret).verify(in_grace["body"], in_grace["headers"])
    assert len(after["headers"]["webhook-signature"].split(" ")) == 1
    Webhook(current).verify(after["body"], after["headers"])
    for superseded in (first, graced):
        with pytest.raises(WebhookVerificationError):
            Webhook(superseded).verify(after["body"], after["headers"])


# -- usage.threshold under concurrent verifies ----------------------------------------------

def _set_usage(app, tenant, usage_count):
    with app.app_context(), unit_of_work():
        row = db.session.get(MonthlyUsage, (tenant.tenant_id, billing_period(), 0))
        if row is None:
            db.session.add(MonthlyUsage(tenant_id=tenant.tenant_id, period=billing_period(),
                                        usage_count=usage_count))
        else:
            row.usage_count = usage_count


def _verify_concurrently(server, tenant, clients=8, each=3):
    barrier = threading.Barrier(clients)

    def run(_):
        barrier.wait()
        statuses = []
        for _ in range(each):
            statuses.append(requests.post(server.url + "/v1/intent/verify", headers=tenant.headers,
                                          timeout=30, json={
                "original_intent_hash": "sha256:" + uuid.uuid4().hex * 2,
                "response": {"match_id": uuid.uuid4().hex, "payload": {}, "timestamp": 1,
                             "signature": "0" * 64}}).status_code)
        return statuses

    with ThreadPoolExecutor(clients) as pool:
        return sorted(status for statuses in pool.map(run, range(clients)) for status in statuses)


def test_eight_concurrent_clients_cross_each_threshold_once(app, client, make_tenant, tmp_path,
                                                            environment, leak_watch):
    tenant = make_tenant("free")
    server = GunicornServer(tmp_path / "gunicorn.log", {
        **environment, "RATE_LIMIT_CAPACITY": "1000", "AUTH_FAILURE_LIMIT": "1000 per minute"},
        workers=4, threads=2).start()
    try:
        with Receiver() as receiver:
            _endpoint(client, tenant, receiver.url, leak_watch)
            _set_usage(app, tenant, 790)  # the counter near 80 %, then past it: 814
            assert _verify_concurrently(server, tenant) == [200] * 24
            _set_usage(app, tenant, 990)  # then to the plan's end: 10 more fit, 14 are refused
            assert _verify_concurrently(server, tenant) == [200] * 10 + [429] * 14
            with app.app_context():
                delivery.deliver_due(app.config)
            receiver.wait_for(2)
    finally:
        server.stop()
        assert leak_watch.leaks_in(server.log_path.read_text(errors="replace")) == []
    alerts = sorted((event["data"]["threshold"], event["data"]["usage_count"])
                    for event in receiver.events())
    assert alerts == [(80, 800), (100, 1000)]
    assert {event["data"]["rate_limit"] for event in receiver.events()} == {1000}
    assert {event["data"]["period"] for event in receiver.events()} == {billing_period()}
    with app.app_context():
        raised = db.session.execute(select(func.count()).select_from(WebhookEvent).where(
            WebhookEvent.tenant_id == tenant.tenant_id,
            WebhookEvent.type == "usage.threshold")).scalar_one()
    assert raised == 2
