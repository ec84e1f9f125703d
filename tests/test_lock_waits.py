"""A verify whose rows another transaction holds gives up within the request budget: a 503 that
leaves nothing written, so the same request succeeds once the lock is gone (on SQLite, the
database's write lock). And a move to a limited plan waits for the verifications in flight."""
import sqlite3
import threading
import time

import psycopg2
import pytest
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from tests.conftest import TEST_DATABASE_URL
from tests.support import assert_envelope, scale_response, set_usage, wait_for_a_lock_wait

postgresql_only = pytest.mark.skipif(not TEST_DATABASE_URL, reason="row locks are PostgreSQL's")


def _verify_body(client, tenant):
    intent_hash = client.post("/v1/intent/generate", headers=tenant.headers,
                              json={"user_token": "lock-wait-token"}).get_json()["intent_hash"]
    return {"original_intent_hash": intent_hash,
            "response": scale_response(tenant.signing_secret, intent_hash)}


@postgresql_only
def test_a_verify_behind_a_held_usage_row_is_a_503_and_changes_nothing(client, tenant):
    first = client.post("/v1/intent/verify", headers=tenant.headers,
                        json=_verify_body(client, tenant))
    assert first.get_json()["cleared"] is True  # the month's usage row exists from here on
    body = _verify_body(client, tenant)
    # An operator's transaction holding the month's usage row (a plan change left open, say).
    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    try:
        with engine.connect() as holder:
            holder.execute(text("SELECT usage_count FROM monthly_usage WHERE tenant_id = :id"
                                " FOR UPDATE"), {"id": tenant.tenant_id})
            waited = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
            holder.rollback()
    finally:
        engine.dispose()
    assert_envelope(waited, 503, "service temporarily unavailable")
    assert waited.headers["Retry-After"] == "1"
    # Nothing was consumed or counted: the same request clears now, and the month shows two.
    again = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
    assert again.status_code == 200 and again.get_json()["cleared"] is True
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert usage["usage_count"] == 2


def _sessions_waiting(dsn):
    with psycopg2.connect(dsn) as watching, watching.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                       " AND datname = current_database()")
        return cursor.fetchone()[0]


@postgresql_only
def test_a_move_to_a_limited_plan_waits_for_the_verification_in_flight_and_counts_it(
        app, client, make_tenant, admin_headers):
    """An enterprise tenant at 999 verifications moves to free while one of its verifies is in
    flight (it waits here for its intent's row). The move waits for it and folds it: the month
    is at the plan's 1,000 and the next verify is refused. Before, the move folded first, the
    verify in flight counted on its day alone, and the next one cleared: 1,001 of 1,000."""
    tenant = make_tenant("enterprise")
    set_usage(app, tenant.tenant_id, 999)
    in_flight, after = _verify_body(client, tenant), _verify_body(client, tenant)
    dsn = normalize_database_url(TEST_DATABASE_URL).replace("postgresql+psycopg2", "postgresql")
    answers = {}

    def ask(name, method, path, **kwargs):
        answers[name] = app.test_client().open(path, method=method, **kwargs)

    holder = psycopg2.connect(dsn)  # a transaction holding the in-flight verify's intent row
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT 1 FROM intents WHERE intent_hash = %s FOR UPDATE",
                           (in_flight["original_intent_hash"],))
        verifying = threading.Thread(target=ask, args=(
            "verify", "POST", "/v1/intent/verify"), kwargs={
            "headers": tenant.headers, "json": in_flight})
        verifying.start()
        wait_for_a_lock_wait(dsn)
        moving = threading.Thread(target=ask, args=(
            "move", "PATCH", f"/v1/admin/tenants/{tenant.tenant_id}"), kwargs={
            "headers": admin_headers, "json": {"plan": "free"}})
        moving.start()
        deadline = time.monotonic() + 3  # the move waits for the verify's plan lock
        while _sessions_waiting(dsn) < 2 and moving.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        holder.rollback()
        holder.close()
    verifying.join(10)
    moving.join(10)
    assert answers["verify"].get_json()["cleared"] is True
    assert answers["move"].status_code == 200
    assert_envelope(client.post("/v1/intent/verify", headers=tenant.headers, json=after), 429,
                    "monthly verification limit reached")
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert (usage["plan"], usage["usage_count"]) == ("free", 1000)


@pytest.mark.skipif(bool(TEST_DATABASE_URL), reason="the embedded default's lock (SQLite)")
def test_a_verify_behind_a_held_sqlite_write_lock_is_a_503_within_the_lock_wait(app, client,
                                                                                 tenant):
    """The embedded default: a connection holding SQLite's write lock (a CLI command, another
    worker, an operator's shell) makes a verify wait LOCK_SECONDS, then 503 with nothing
    written. It waited 30 s, past the request's budget, holding its thread."""
    body = _verify_body(client, tenant)
    holder = sqlite3.connect(app.config["SQLALCHEMY_DATABASE_URI"][len("sqlite:///"):],
                             isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        waited = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
        seconds = time.monotonic() - started
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert_envelope(waited, 503, "service temporarily unavailable")
    assert seconds < 20, f"waited {seconds:.1f} s for the lock"
    assert client.post("/v1/intent/verify", headers=tenant.headers,
                       json=body).get_json()["cleared"] is True
