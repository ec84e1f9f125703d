"""A tenant's counters are rows per shard (app.tenants.metering.SHARDS): each verification
counts on its server connection's shard of its day, a limited plan's month on shard 0 against
the sum of all, and every reader sums them."""
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
from tests.support import assert_envelope, cleared_day, scale_response

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


def _days(app, tenant_id, counts):
    """Verifications counted on today's day rows, `counts` {shard: verifications}, all cleared."""
    with app.app_context(), unit_of_work():
        db.session.add_all(cleared_day(tenant_id, utc_day(), shard, count)
                           for shard, count in counts.items())


def _usage(client, tenant):
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    return usage["usage_count"], usage["remaining"]


def test_an_unlimited_month_is_its_days_and_a_limited_plan_counts_them_against_it(
        client, make_tenant, admin_headers):
    """An unlimited plan's verifications count on their days alone; the month's usage_count is
    the sum of its days. A move to a limited plan counts them against it (shard 1), and the
    limited plan counts on shard 0 against the sum of the shards: the month never passes it."""
    tenant = make_tenant("enterprise")
    with time_machine.travel(T0, tick=False):
        # 996 verifications today: 300 counted before months were read from their days (on
        # both counters), 696 since (on the days alone).
        _days(client.application, tenant.tenant_id, {0: 400, 5: 300, 11: 296})
        with client.application.app_context(), unit_of_work():
            db.session.add(MonthlyUsage(tenant_id=tenant.tenant_id, period=billing_period(),
                                        shard=5, usage_count=300))
        assert [_verify(client, tenant).status_code for _ in range(2)] == [200, 200]
        assert _shards(client.application, MonthlyUsage.usage_count, tenant.tenant_id) == {
            5: 300}
        assert _usage(client, tenant) == (998, None)

        def change_plan(plan):
            assert client.patch(f"/v1/admin/tenants/{tenant.tenant_id}", headers=admin_headers,
                                json={"plan": plan}).status_code == 200

        change_plan("free")  # 1,000 a month
        assert _usage(client, tenant) == (998, 2)
        hashes = [_generate(client, tenant) for _ in range(3)]
        assert [_verify(client, tenant, h).status_code for h in hashes[:2]] == [200, 200]
        assert_envelope(_verify(client, tenant, hashes[2]), 429,
                        "monthly verification limit reached")
        assert _usage(client, tenant) == (1000, 0)
        months = {0: 2, 1: 698, 5: 300}
        assert _shards(client.application, MonthlyUsage.usage_count, tenant.tenant_id) == months
        # Another change counts nothing twice: the days hold nothing the month does not.
        change_plan("starter")
        assert _shards(client.application, MonthlyUsage.usage_count, tenant.tenant_id) == months
        assert _usage(client, tenant) == (1000, 49_000)


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
    """Verifications land on mod(pg_backend_pid(), 16), so concurrent ones of one tenant take
    different rows' locks: an unlimited plan's on its day's rows only."""
    tenant = make_tenant("enterprise")
    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    expected = Counter()
    try:
        connections = [engine.connect() for _ in range(3)]
        for connection in connections:
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            for _ in range(pid % 4 + 1):  # a different number from each connection
                reason = connection.execute(text(
                    "SELECT intentgate_verdict(1, 'sha256:none', :owner,"
                    " 'm', true, 1, 60, :tenant, :period, :day, NULL, 'evt', NULL, NULL)"),
                    {"owner": f"tenant:{tenant.tenant_id}", "tenant": tenant.tenant_id,
                     "period": billing_period(), "day": utc_day()}).scalar_one()
                connection.commit()
                assert reason == "UnknownIntent"
                expected[pid % 16] += 1
        for connection in connections:
            connection.close()
    finally:
        engine.dispose()
    assert _shards(app, MonthlyUsage.usage_count, tenant.tenant_id) == {}
    assert _shards(app, DailyUsage.verifications, tenant.tenant_id) == dict(expected)
