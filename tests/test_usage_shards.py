"""A tenant's counters are rows per shard (app.tenants.metering.SHARDS): each verification
counts on its server connection's shard, a limited plan's month on shard 0 against the sum of
all, and every reader sums them."""
from collections import Counter

import pytest
import time_machine
from sqlalchemy import create_engine, select, text

from app.clock import billing_period, utc_day
from app.config import normalize_database_url
from app.extensions import db
from app.tenants.models import DailyUsage, MonthlyUsage
from app.sql import unit_of_work
from tests.conftest import TEST_DATABASE_URL
from tests.support import assert_envelope, scale_response

T0 = 1_800_000_000  # 2027-01-15


def _generate(client, tenant):
    return client.post("/v1/intent/generate", headers=tenant.headers,
                       json={"user_token": "shard-user-token"}).get_json()["intent_hash"]


def _verify(client, tenant, intent_hash=None):
    intent_hash = intent_hash or _generate(client, tenant)
    return client.post("/v1/intent/verify", headers=tenant.headers, json={
        "original_intent_hash": intent_hash,
        "response": scale_response(tenant.signing_secret, intent_hash)})


def _shards(app, count, tenant_id):
    """{shard: count} of `count` (a counter column) for the tenant's rows."""
    model = count.class_
    with app.app_context():
        return dict(db.session.execute(
            select(model.shard, count).where(model.tenant_id == tenant_id)).all())


def test_a_month_counted_on_several_shards_is_read_and_limited_as_their_sum(client,
                                                                           make_tenant):
    """Counts an unlimited plan left on other shards (before a move to a limited plan) count
    against the limit: the month never passes it."""
    tenant = make_tenant("free")  # 1,000 a month
    with client.application.app_context(), unit_of_work():
        db.session.add_all(MonthlyUsage(tenant_id=tenant.tenant_id, period=billing_period(),
                                        shard=shard, usage_count=count)
                           for shard, count in ((0, 400), (5, 300), (11, 298)))
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert (usage["usage_count"], usage["remaining"]) == (998, 2)
    hashes = [_generate(client, tenant) for _ in range(3)]
    assert [_verify(client, tenant, h).status_code for h in hashes[:2]] == [200, 200]
    assert_envelope(_verify(client, tenant, hashes[2]), 429, "monthly verification limit reached")
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert (usage["usage_count"], usage["remaining"]) == (1000, 0)
    # The limited plan counted on shard 0 alone.
    assert _shards(client.application, MonthlyUsage.usage_count, tenant.tenant_id) == {
        0: 402, 5: 300, 11: 298}


def test_a_day_counted_on_several_shards_is_their_sum(client, tenant):
    with time_machine.travel(T0, tick=False):
        with client.application.app_context(), unit_of_work():
            db.session.add_all(DailyUsage(
                tenant_id=tenant.tenant_id, day=utc_day(), shard=shard, verifications=count,
                cleared=count - 1, unknown_intent=1, expired_intent=0, replayed_intent=0,
                invalid_signature=0, timestamp_out_of_window=0, replayed_response=0)
                for shard, count in ((0, 3), (9, 4)))
        assert _verify(client, tenant).status_code == 200
        days = client.get("/v1/tenant/usage/daily?days=1",
                          headers=tenant.headers).get_json()["days"]
    assert days == [{"date": "2027-01-15", "verifications": 8, "cleared": 6, "blocked": {
        "UnknownIntent": 2, "ExpiredIntent": 0, "ReplayedIntent": 0, "InvalidSignature": 0,
        "TimestampOutOfWindow": 0, "ReplayedResponse": 0}}]


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="shards are PostgreSQL's server connections")
def test_each_server_connection_counts_on_its_own_shard(app, make_tenant):
    """An unlimited plan's verifications land on mod(pg_backend_pid(), 16), day and month
    alike, so concurrent ones of one tenant take different rows' locks."""
    tenant = make_tenant("enterprise")
    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    expected = Counter()
    try:
        connections = [engine.connect() for _ in range(3)]
        for connection in connections:
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            for _ in range(pid % 4 + 1):  # a different number from each connection
                reason = connection.execute(text(
                    "SELECT reason FROM intentgate_verify(1, 'sha256:none', :owner, 'm', true,"
                    " 1, 60, :tenant, :period, :day, NULL, 'evt')"),
                    {"owner": f"tenant:{tenant.tenant_id}", "tenant": tenant.tenant_id,
                     "period": billing_period(), "day": utc_day()}).scalar_one()
                connection.commit()
                assert reason == "UnknownIntent"
                expected[pid % 16] += 1
        for connection in connections:
            connection.close()
    finally:
        engine.dispose()
    assert _shards(app, MonthlyUsage.usage_count, tenant.tenant_id) == dict(expected)
    assert _shards(app, DailyUsage.verifications, tenant.tenant_id) == dict(expected)
