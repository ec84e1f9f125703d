"""flask intents purge: expired intents and their replay records go, live ones stay."""
import threading
import time

import pytest
import time_machine
from sqlalchemy import event, func, select

from app.extensions import db
from app.intents.models import IdempotencyRecord, Intent, SeenResponse
from app.webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from tests.conftest import TEST_DATABASE_URL
from tests.support import postgresql_connection, scale_response, wait_for_a_lock_wait


def _count(app, model):
    with app.app_context():
        return db.session.execute(select(func.count()).select_from(model)).scalar_one()


def _generate(client, tenant, ttl):
    return client.post("/v1/intent/generate", headers=tenant.headers,
                       json={"user_token": "purge-token-123", "ttl": ttl}).get_json()["intent_hash"]


def _verify(client, tenant, intent_hash, match_id):
    response = scale_response(tenant.signing_secret, intent_hash, match_id=match_id)
    return client.post("/v1/intent/verify", headers=tenant.headers, json={
        "original_intent_hash": intent_hash, "response": response}).get_json()["reason"]


def test_purge_deletes_old_expired_intents_in_batches(runner, client, tenant):
    with time_machine.travel(1_700_000_000, tick=False):
        hashes = [_generate(client, tenant, ttl=60) for _ in range(5)]
        assert _verify(client, tenant, hashes[0], "m-1") is None
        assert _verify(client, tenant, hashes[1], "m-1") == "ReplayedResponse"
        with client.application.app_context():
            db.session.add(IdempotencyRecord(owner="tenant:1", idempotency_key="k",
                                             body_digest="0" * 64, cleared=True,
                                             created_at=1_700_000_000))
            db.session.commit()
    assert _count(client.application, SeenResponse) == 1
    with time_machine.travel(1_700_000_000 + 60 + 86521, tick=False):
        live = _generate(client, tenant, ttl=3600)
        result = runner.invoke(args=["intents", "purge", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    assert "purged 2 intents" in result.output and "purged 5 intents" in result.output
    assert "done: 5 intents and 1 idempotency records deleted" in result.output
    with client.application.app_context():
        assert db.session.execute(select(Intent.intent_hash)).scalars().all() == [live]
    assert _count(client.application, SeenResponse) == 0
    assert _count(client.application, IdempotencyRecord) == 0


def test_purging_a_replay_leaves_the_first_sighting_in_force(runner, client, tenant):
    """The intent that replayed a match_id expires first: its purge must not take the replay
    record of the intent that cleared with it, still alive."""
    with time_machine.travel(1_700_000_000, tick=False):
        first, replay = _generate(client, tenant, 86400), _generate(client, tenant, 60)
        assert _verify(client, tenant, first, "m-shared") is None
        assert _verify(client, tenant, replay, "m-shared") == "ReplayedResponse"
    with time_machine.travel(1_700_000_000 + 60 + 86521, tick=False):
        result = runner.invoke(args=["intents", "purge"])
        assert "done: 1 intents" in result.output, result.output
        assert _verify(client, tenant, _generate(client, tenant, 60),
                       "m-shared") == "ReplayedResponse"
    assert _count(client.application, SeenResponse) == 1


def test_purge_keeps_intents_inside_the_margin(runner, client, tenant):
    with time_machine.travel(1_700_000_000, tick=False):
        client.post("/v1/intent/generate", headers=tenant.headers,
                    json={"user_token": "purge-token-123", "ttl": 60})
    with time_machine.travel(1_700_000_000 + 60 + 100_000, tick=False):
        result = runner.invoke(args=["intents", "purge", "--older-than", "100001"])
    assert "done: 0 intents" in result.output and _count(client.application, Intent) == 1


def test_purge_keeps_replay_records_while_their_response_could_clear_again(runner, client,
                                                                           tenant):
    """A response signed under the payload scheme names no intent: replayed on a new intent
    issued within the skew of its timestamp, only its replay record stops it, for as long as
    that intent may live (a probe: purged with --older-than 0, the replay cleared)."""
    with time_machine.travel(1_700_000_000, tick=False):
        client.post("/v1/intent/generate", headers=tenant.headers,
                    json={"user_token": "purge-token-123", "ttl": 60})
    with time_machine.travel(1_700_000_000 + 60 + 86520, tick=False):  # the least margin
        assert "done: 0 intents" in runner.invoke(args=["intents", "purge"]).output
        # A timer written for the earlier default goes on, at the least margin, and says so.
        result = runner.invoke(args=["intents", "purge", "--older-than", "0"])
        assert result.exit_code == 0 and "done: 0 intents" in result.output
        assert "warning: --older-than 0 is raised to 86520 seconds" in result.output
    with time_machine.travel(1_700_000_000 + 60 + 86521, tick=False):
        assert "done: 1 intents" in runner.invoke(args=["intents", "purge"]).output


def test_every_purge_deletes_in_bounded_batches(runner, client, tenant):
    """Idempotency records (one per SDK verify: a day's traffic) and webhook deliveries go in
    transactions of at most --batch-size rows, like the intents, never in one DELETE."""
    with client.application.app_context():
        for n in range(5):
            db.session.add(IdempotencyRecord(
                owner=f"tenant:{tenant.tenant_id}", idempotency_key=f"k{n}", body_digest="0" * 64,
                cleared=True, created_at=1_700_000_000))
        db.session.add(WebhookEndpoint(
            tenant_id=tenant.tenant_id, id="we_1", url="https://a.example", events="*",
            secret_sealed="x", created_at=1_700_000_000))
        db.session.flush()
        for n in range(5):
            db.session.add(WebhookEvent(
                tenant_id=tenant.tenant_id, id=f"msg_{n}", type="webhook.test", data="{}",
                created_at=1_700_000_000, dispatched_at=1_700_000_000))
            db.session.add(WebhookDelivery(
                tenant_id=tenant.tenant_id, id=f"whd_{n}", endpoint_id="we_1",
                event_id=f"msg_{n}", attempt=1, scheduled_at=1_700_000_000, at=1_700_000_000))
        db.session.commit()
        deleted = []

        def count_deletes(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("DELETE"):
                deleted.append(cursor.rowcount)

        event.listen(db.engine, "after_cursor_execute", count_deletes)
        try:
            result = runner.invoke(args=["intents", "purge", "--batch-size", "2"])
        finally:
            event.remove(db.engine, "after_cursor_execute", count_deletes)
    assert result.exit_code == 0, result.output
    assert "done: 0 intents and 5 idempotency records deleted" in result.output
    assert "webhooks: 5 delivery attempts and 5 events deleted" in result.output
    assert max(deleted) == 2 and sum(deleted) == 15
    assert _count(client.application, IdempotencyRecord) == 0
    assert _count(client.application, WebhookEvent) == 0


def test_an_idempotency_record_renewed_while_the_purge_runs_is_kept(runner, client, tenant):
    """The purge finds stale records, then deletes them: a record a retry renews in between
    (a new execution of its key, past the 24 h window) is not stale any more and must stay,
    or the key's next retry would verify again. PostgreSQL: the DELETE waits for the renewing
    transaction's lock and then re-checks its condition on the renewed row."""
    if not TEST_DATABASE_URL:
        pytest.skip("PostgreSQL's row locks order the purge after the renewal")
    owner = f"tenant:{tenant.tenant_id}"
    with client.application.app_context():
        db.session.add(IdempotencyRecord(owner=owner, idempotency_key="k", body_digest="0" * 64,
                                         cleared=True, created_at=1_700_000_000))
        db.session.commit()
    renewing = postgresql_connection()
    try:
        renewing.cursor().execute(
            "UPDATE idempotency_records SET created_at = %s WHERE owner = %s",
            (int(time.time()), owner))
        results = []
        purging = threading.Thread(target=lambda: results.append(
            runner.invoke(args=["intents", "purge"])))
        purging.start()
        wait_for_a_lock_wait(renewing.dsn)  # the purge found the stale record and waits for it
        renewing.commit()
        purging.join(timeout=30)
    finally:
        renewing.close()
    assert results[0].exit_code == 0, results[0].output
    assert "done: 0 intents and 0 idempotency records deleted" in results[0].output
    assert _count(client.application, IdempotencyRecord) == 1

