"""flask intents purge: expired intents and their replay records go, live ones stay."""
import time_machine
from sqlalchemy import func, select

from app.extensions import db
from app.intents.models import IdempotencyRecord, Intent, SeenResponse


def _count(app, model):
    with app.app_context():
        return db.session.execute(select(func.count()).select_from(model)).scalar_one()


def test_purge_deletes_old_expired_intents_in_batches(runner, client, tenant):
    with time_machine.travel(1_700_000_000, tick=False):
        for _ in range(5):
            client.post("/v1/intent/generate", headers=tenant.headers,
                        json={"user_token": "purge-token-123", "ttl": 60})
        with client.application.app_context():
            old = db.session.execute(select(Intent.id)).scalars().first()
            db.session.add(SeenResponse(owner=f"tenant:{tenant.tenant_id}", match_id="m-1",
                                        intent_id=old))
            db.session.add(IdempotencyRecord(owner="tenant:1", idempotency_key="k",
                                             body_digest="0" * 64, cleared=True,
                                             created_at=1_700_000_000))
            db.session.commit()
    with time_machine.travel(1_700_000_000 + 86400 + 61, tick=False):
        live = client.post("/v1/intent/generate", headers=tenant.headers,
                           json={"user_token": "purge-token-123"}).get_json()["intent_hash"]
        result = runner.invoke(args=["intents", "purge", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    assert "purged 2 intents" in result.output and "purged 5 intents" in result.output
    assert "done: 5 intents and 1 idempotency records deleted" in result.output
    with client.application.app_context():
        assert db.session.execute(select(Intent.intent_hash)).scalars().all() == [live]
    assert _count(client.application, SeenResponse) == 0
    assert _count(client.application, IdempotencyRecord) == 0


def test_purge_keeps_intents_inside_the_margin(runner, client, tenant):
    with time_machine.travel(1_700_000_000, tick=False):
        client.post("/v1/intent/generate", headers=tenant.headers,
                    json={"user_token": "purge-token-123", "ttl": 60})
    with time_machine.travel(1_700_000_000 + 3600, tick=False):
        result = runner.invoke(args=["intents", "purge", "--older-than", "7200"])
    assert "done: 0 intents" in result.output and _count(client.application, Intent) == 1
