"""Ready to distribute by tenant (deploy/README.md, Citus): every primary key, unique constraint
and foreign key of a per-tenant table holds the tenant's column, so each lives on one shard."""
import time
import uuid

from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect, text

from app import create_app, crypto
from app.extensions import db
from tests.support import Credentials, scale_response
from tests.test_migrations import _old_tenant

# Tables every shard needs whole: looked up before the tenant is known (an API key by its
# digest), or not a tenant's at all. rate_buckets is the embedded setup's token bucket (Redis
# holds it in any deployment that distributes).
REFERENCE_TABLES = {"tenants", "admin_keys", "api_keys", "rate_buckets", "secret_key_checks",
                    "alembic_version"}
OWNER_COLUMNS = {"owner", "tenant_id"}
BEFORE_OWNER_KEYS = "e5f9a3b72c48"


def _lacking_owner(inspector, table):
    """The keys, unique constraints and unique indexes of `table` without an owner column."""
    lacking = []
    primary = inspector.get_pk_constraint(table)
    if not OWNER_COLUMNS & set(primary["constrained_columns"]):
        lacking.append(("primary key", primary["constrained_columns"]))
    for unique in inspector.get_unique_constraints(table):
        if not OWNER_COLUMNS & set(unique["column_names"]):
            lacking.append((unique["name"], unique["column_names"]))
    for index in inspector.get_indexes(table):
        if index["unique"] and not OWNER_COLUMNS & set(index["column_names"]):
            lacking.append((index["name"], index["column_names"]))
    for foreign in inspector.get_foreign_keys(table):
        # Between two distributed tables a foreign key must hold the distribution column.
        if (foreign["referred_table"] not in REFERENCE_TABLES
                and not OWNER_COLUMNS & set(foreign["constrained_columns"])):
            lacking.append((foreign["name"], foreign["constrained_columns"]))
    return lacking


def test_every_per_tenant_key_holds_the_owner_column(app):
    with app.app_context():
        inspector = inspect(db.engine)
        tables = set(inspector.get_table_names())
        assert REFERENCE_TABLES - {"alembic_version"} <= tables  # the list is not stale
        per_tenant = sorted(tables - REFERENCE_TABLES)
        assert {"intents", "seen_responses", "monthly_usage", "daily_usage"} <= set(per_tenant)
        lacking = {table: _lacking_owner(inspector, table) for table in per_tenant}
    assert {table: found for table, found in lacking.items() if found} == {}


def test_intents_stored_before_the_upgrade_keep_their_verdicts(base_settings, leak_watch,
                                                               empty_database_url):  # noqa: F811
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    api_key, signing_secret = crypto.new_api_key(), "sig_live_" + "a" * 64
    leak_watch.add(api_key)
    now = int(time.time())
    used, unused = ("sha256:" + uuid.uuid4().hex * 2 for _ in range(2))
    with app.app_context():
        upgrade(revision=BEFORE_OWNER_KEYS)
        # Rows as that release wrote them: one intent verified (its match_id seen), one unused.
        tenant_id = _old_tenant("distributed@example.com", api_key)
        owner = f"tenant:{tenant_id}"
        ids = [db.session.execute(text(
            "INSERT INTO intents (intent_hash, owner, intent_class, issued_at, expires_at,"
            " consumed_at) VALUES (:hash, :owner, 'other', :now, :expires, :consumed)"
            " RETURNING id"), {"hash": intent_hash, "owner": owner, "now": now - 10,
                               "expires": now + 3600, "consumed": consumed_at}).scalar_one()
            for intent_hash, consumed_at in ((used, now), (unused, None))]
        db.session.execute(text("INSERT INTO seen_responses (owner, match_id, intent_id)"
                                " VALUES (:owner, 'seen-before', :id)"),
                           {"owner": owner, "id": ids[0]})
        db.session.commit()
        upgrade()
        db.session.remove()
    app.extensions["database"].engine.dispose()  # the tables were copied under SQLite
    tenant = Credentials(tenant_id, "distributed@example.com", api_key, signing_secret)
    client = app.test_client()

    def verify(intent_hash, **overrides):
        response = scale_response(tenant.signing_secret, intent_hash, **overrides)
        answer = client.post("/v1/intent/verify", headers=tenant.headers, json={
            "original_intent_hash": intent_hash, "response": response})
        assert answer.status_code == 200, answer.get_json()
        return answer.get_json()["reason"]

    def generate():
        answer = client.post("/v1/intent/generate", headers=tenant.headers,
                             json={"user_token": "tok_" + uuid.uuid4().hex})
        assert answer.status_code == 200, answer.get_json()
        return answer.get_json()["intent_hash"]

    assert verify(used) == "ReplayedIntent"
    assert verify(unused, match_id="seen-before") == "ReplayedResponse"
    assert verify(generate()) is None  # a new intent numbered after the stored ones
    with app.app_context():
        assert db.session.execute(text("SELECT count(*) FROM intents")).scalar_one() == 3
        assert db.session.execute(text("SELECT count(*) FROM seen_responses")).scalar_one() == 2
        db.session.remove()
        downgrade(revision=BEFORE_OWNER_KEYS)
        assert db.session.execute(text("SELECT count(*) FROM seen_responses")).scalar_one() == 2
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()
