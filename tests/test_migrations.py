"""Migrations carry data over: a database made by the previous schema keeps working."""
import base64
import hashlib

import click
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect, text

from app import create_app, crypto
from app.clock import billing_period
from app.extensions import db
from app.keyring import ring
from tests.conftest import ENCRYPTION_KEY, TEST_DATABASE_URL

BEFORE_API_KEYS = "3b7c1d2e4f60"  # the revision before api_keys became their own table


def test_a_key_made_before_the_upgrade_works_after_it(base_settings, empty_database_url,
                                                      leak_watch):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    api_key = crypto.new_api_key()
    leak_watch.add(api_key)
    with app.app_context():
        upgrade(revision=BEFORE_API_KEYS)
        # A tenant as the previous schema made it: its one key digest on the tenants row.
        db.session.execute(text(
            "INSERT INTO tenants (email, plan, active, api_key_digest, api_key_prefix,"
            " signing_secret_sealed, signature_scheme, created_at)"
            " VALUES ('old@example.com', 'pro', :active, :digest, :prefix, :sealed, 'bound',"
            " CURRENT_TIMESTAMP)"),
            {"active": True, "digest": crypto.key_digest(api_key),
             "prefix": crypto.display_prefix(api_key), "sealed": crypto.seal("sig_live_" + "a" * 64)})
        db.session.execute(text("INSERT INTO monthly_usage (tenant_id, period, usage_count)"
                                " SELECT id, :period, 7 FROM tenants"), {"period": billing_period()})
        db.session.commit()
        upgrade()
        db.session.remove()
    client = app.test_client()
    usage = client.get("/v1/tenant/usage", headers={"X-Service-Key": api_key})
    assert usage.status_code == 200 and usage.get_json()["email"] == "old@example.com"
    assert usage.get_json()["usage_count"] == 7  # the tenant's rows survive the copy of its table
    (key,) = client.get("/v1/tenant/keys", headers={"X-Service-Key": api_key}).get_json()["keys"]
    assert (key["name"], key["prefix"]) == ("default", api_key[:15])
    with app.app_context():
        stored = db.session.execute(text("SELECT key_digest FROM api_keys")).scalar_one()
        assert stored == hashlib.sha256(api_key.encode()).hexdigest()
        # And back: the downgrade puts the tenant's active key on its row again.
        db.session.remove()
        downgrade(revision=BEFORE_API_KEYS)
        digest = db.session.execute(text("SELECT api_key_digest FROM tenants")).scalar_one()
        assert digest == crypto.key_digest(api_key)
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


def _old_tenant(email, api_key=None):
    """A tenant row written as any revision since api_keys has its own table stores it (the
    service code builds rows for the newest schema), with one key when `api_key` is given."""
    tenant_id = db.session.execute(text(
        "INSERT INTO tenants (email, plan, active, signing_secret_sealed, signature_scheme,"
        " created_at) VALUES (:email, 'pro', :active, :sealed, 'bound', CURRENT_TIMESTAMP)"
        " RETURNING id"),
        {"email": email, "active": True, "sealed": crypto.seal("sig_live_" + "a" * 64)}
    ).scalar_one()
    if api_key is not None:
        db.session.execute(text(
            "INSERT INTO api_keys (id, tenant_id, name, key_digest, prefix, created_at)"
            " VALUES ('ak_old', :tenant, 'default', :digest, :prefix, 1)"),
            {"tenant": tenant_id, "digest": crypto.key_digest(api_key),
             "prefix": crypto.display_prefix(api_key)})
    return tenant_id


BEFORE_WEAK_KEY_CHECK = "f7a1c3e5b920"
IDENTITY_POINT = base64.b64encode(bytes([1]) + bytes(31)).decode()


def test_the_upgrade_revokes_stored_signing_keys_of_small_order(base_settings,
                                                                 empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    real = base64.b64encode(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
    with app.app_context():
        upgrade(revision=BEFORE_WEAK_KEY_CHECK)
        tenant_id = _old_tenant("weak@example.com")
        for key_id, public_key in (("sk_weak", IDENTITY_POINT), ("sk_real", real)):
            db.session.execute(text(
                "INSERT INTO signing_keys (tenant_id, id, public_key, created_at)"
                " VALUES (:tenant, :id, :key, 1)"), {"tenant": tenant_id, "id": key_id,
                                                     "key": public_key})
        db.session.commit()
        upgrade()
        revoked = dict(db.session.execute(text(
            "SELECT id, revoked_at IS NOT NULL FROM signing_keys")).all())
        assert revoked == {"sk_weak": True, "sk_real": False}
        entry = db.session.execute(text(
            "SELECT action, actor, details FROM audit_log WHERE tenant_id = :tenant"
            " ORDER BY id DESC LIMIT 1"), {"tenant": tenant_id}).one()
        assert entry == ("signing_key.revoked", "cli",
                         '{"key_id": "sk_weak", "reason": "small order"}')
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_SEEN_RESPONSES_LOST_THEIR_KEY = "a2c4e6f8b013"


def test_seen_responses_lose_their_foreign_key_and_keep_their_rows(base_settings,
                                                                   empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def foreign_keys():
        return [key["name"] for key in inspect(db.engine).get_foreign_keys("seen_responses")]

    with app.app_context():
        upgrade(revision=BEFORE_SEEN_RESPONSES_LOST_THEIR_KEY)
        db.session.execute(text(
            "INSERT INTO intents (id, intent_hash, owner, intent_class, issued_at, expires_at)"
            " VALUES (1, 'sha256:x', 'tenant:1', 'general', 1, 2)"))
        db.session.execute(text("INSERT INTO seen_responses (owner, match_id, intent_id)"
                                " VALUES ('tenant:1', 'm-1', 1)"))
        db.session.commit()
        assert foreign_keys() == ["fk_seen_responses_owner_intents"]
        upgrade()
        assert foreign_keys() == []
        downgrade(revision=BEFORE_SEEN_RESPONSES_LOST_THEIR_KEY)
        assert foreign_keys() == ["fk_seen_responses_owner_intents"]
        assert db.session.execute(text("SELECT owner, match_id, intent_id FROM seen_responses")
                                  ).all() == [("tenant:1", "m-1", 1)]
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_SCOPES = "c6e8f0a2b146"


def test_keys_made_before_scopes_keep_every_scope_and_duplicate_public_keys_go(
        base_settings, empty_database_url, leak_watch):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    api_key = crypto.new_api_key()
    leak_watch.add(api_key)
    public_key = base64.b64encode(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
    with app.app_context():
        upgrade(revision=BEFORE_SCOPES)
        tenant_id = _old_tenant("scoped@example.com", api_key)
        for key_id, created_at in (("sk_first", 1), ("sk_again", 2)):
            db.session.execute(text(
                "INSERT INTO signing_keys (tenant_id, id, public_key, created_at)"
                " VALUES (:tenant, :id, :key, :at)"),
                {"tenant": tenant_id, "id": key_id, "key": public_key, "at": created_at})
        db.session.commit()
        upgrade()
        db.session.remove()
    client = app.test_client()
    headers = {"X-Service-Key": api_key}
    (key,) = client.get("/v1/tenant/keys", headers=headers).get_json()["keys"]
    assert key["scopes"] == ["intents", "usage:read", "keys:write", "signing:write",
                             "webhooks:write"]
    (signing_key,) = client.get("/v1/tenant/signing-keys", headers=headers).get_json()[
        "signing_keys"]
    assert signing_key["id"] == "sk_first"  # the newer duplicate is revoked, the oldest stays
    assert client.post("/v1/tenant/signing-secret/rotate", headers=headers,
                       json={}).status_code == 200
    with app.app_context():
        entry = db.session.execute(text(
            "SELECT action, actor, details FROM audit_log WHERE tenant_id = :tenant"
            " ORDER BY id LIMIT 1"), {"tenant": tenant_id}).one()
        assert entry == ("signing_key.revoked", "cli",
                         '{"duplicate_of": "sk_first", "key_id": "sk_again"}')
    narrow = client.post("/v1/tenant/keys", headers=headers,
                         json={"name": "backend", "scopes": ["intents"]}).get_json()
    leak_watch.add(narrow["api_key"])
    with app.app_context():
        db.session.remove()
        downgrade(revision=BEFORE_SCOPES)
        # The previous release makes a key of its own, not knowing scopes.
        db.session.execute(text(
            "INSERT INTO api_keys (tenant_id, id, name, key_digest, prefix, created_at)"
            " VALUES (:tenant, 'ak_old_release', 'old', :digest, 'key_live_000000', 1)"),
            {"tenant": tenant_id, "digest": "0" * 64})
        db.session.commit()
        if TEST_DATABASE_URL:  # the previous release's key lookup is back, and finds the key
            found = db.session.execute(text(
                "SELECT id FROM intentgate_tenant_by_key_digest(:digest, :period, 0)"),
                {"digest": crypto.key_digest(api_key), "period": billing_period()}).all()
            assert found == [(tenant_id,)]
        db.session.remove()
        upgrade()
        db.session.remove()
        db.engine.dispose()
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 200
    # Back up, a key narrowed to intents holds intents alone, not every scope: the downgrade
    # kept what it could. The old release's key held every power, and keeps it.
    scopes = {key["id"]: key["scopes"]
              for key in client.get("/v1/tenant/keys", headers=headers).get_json()["keys"]}
    assert scopes[narrow["id"]] == ["intents"]
    assert len(scopes["ak_old_release"]) == 5
    assert client.post("/v1/tenant/keys", headers={"X-Service-Key": narrow["api_key"]},
                       json={"name": "escalated"}).status_code == 403
    app.extensions["database"].engine.dispose()


BEFORE_KEY_CHECKS = "a7c1e3f5b209"


def test_the_upgrade_records_the_key_that_sealed_the_secrets_and_downgrades(base_settings,
                                                                            empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def check_values():
        return db.session.execute(text("SELECT check_value FROM secret_key_checks")
                                  ).scalars().all()

    with app.app_context():
        upgrade(revision=BEFORE_KEY_CHECKS)
        _old_tenant("before@example.com")
        db.session.commit()
        upgrade()
        assert check_values() == [ring.check_value(ENCRYPTION_KEY)]
        db.session.remove()
        downgrade(revision=BEFORE_KEY_CHECKS)
        assert not inspect(db.engine).has_table("secret_key_checks")
        assert db.session.execute(text("SELECT count(*) FROM tenants")).scalar_one() == 1
        db.session.remove()
        upgrade()
        assert check_values() == [ring.check_value(ENCRYPTION_KEY)]
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_WEBHOOKS = "e3a5c7d9f142"


def test_tenants_made_before_webhooks_get_the_default_usage_alerts_and_back(
        base_settings, empty_database_url, leak_watch):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    api_key = crypto.new_api_key()
    leak_watch.add(api_key)
    with app.app_context():
        upgrade(revision=BEFORE_WEBHOOKS)
        tenant_id = _old_tenant("alerts@example.com")
        db.session.execute(text(
            "INSERT INTO api_keys (id, tenant_id, name, key_digest, prefix, scopes, created_at)"
            " VALUES ('ak_old', :tenant, 'default', :digest, :prefix, :scopes, 1)"),
            {"tenant": tenant_id, "digest": crypto.key_digest(api_key),
             "prefix": crypto.display_prefix(api_key),
             "scopes": "intents usage:read keys:write signing:write webhooks:write"})
        db.session.commit()
        upgrade()
        db.session.remove()
    client = app.test_client()
    headers = {"X-Service-Key": api_key}
    assert client.get("/v1/tenant/usage-alerts", headers=headers).get_json() == {
        "thresholds": [80, 100]}
    with app.app_context():
        downgrade(revision=BEFORE_WEBHOOKS)
        tables = set(inspect(db.engine).get_table_names())
        assert not {"webhook_endpoints", "webhook_events", "webhook_deliveries",
                    "usage_alerts"} & tables
        if TEST_DATABASE_URL:  # the previous release's verify function is back and counts
            row = db.session.execute(text(
                "SELECT reason, usage_count FROM intentgate_verify(1, 'sha256:x', :owner, 'm',"
                " true, 1, 60, :tenant, :period, '2026-01-01', 1000)"),
                {"owner": f"tenant:{tenant_id}", "tenant": tenant_id,
                 "period": billing_period()}).one()
            assert row == ("UnknownIntent", 1)
        db.session.commit()
        db.session.remove()
        upgrade()
        db.session.remove()
        db.engine.dispose()
    assert client.get("/v1/tenant/usage-alerts", headers=headers).get_json() == {
        "thresholds": [80, 100]}
    app.extensions["database"].engine.dispose()


BEFORE_MATCH_ID_ON_INTENTS = "d1f3a5c7e924"
MATCH_ID_ON_INTENTS = "c2e4a6f8b135"


def test_each_consumed_intent_gets_its_own_match_id_and_the_replay_records_stay(
        base_settings, empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def indexes(table):
        return {index["name"] for index in inspect(db.engine).get_indexes(table)}

    with app.app_context():
        upgrade(revision=BEFORE_MATCH_ID_ON_INTENTS)
        tenant_id = _old_tenant("match@example.com")
        owner = f"tenant:{tenant_id}"
        # Intent 1 cleared with m-1; intent 2 replayed m-1 (no row of its own); 3 is unused.
        for id_, consumed in ((1, 5), (2, 6), (3, None)):
            db.session.execute(text(
                "INSERT INTO intents (id, intent_hash, owner, intent_class, issued_at,"
                " expires_at, consumed_at) VALUES (:id, :hash, :owner, 'general', 1, 9,"
                " :consumed)"), {"id": id_, "hash": f"sha256:{id_}", "consumed": consumed,
                                 "owner": owner})
        db.session.execute(text("INSERT INTO seen_responses (owner, match_id, intent_id)"
                                " VALUES (:owner, 'm-1', 1)"), {"owner": owner})
        db.session.commit()
        upgrade(revision=MATCH_ID_ON_INTENTS)
        assert db.session.execute(text("SELECT id, match_id FROM intents ORDER BY id")
                                  ).all() == [(1, "m-1"), (2, None), (3, None)]
        db.session.commit()
        assert "ix_intents_id" not in indexes("intents")
        assert "ix_seen_responses_intent_id" not in indexes("seen_responses")
        if TEST_DATABASE_URL:
            assert db.session.execute(text(
                "SELECT reloptions FROM pg_class WHERE relname = 'intents'")).scalar_one() == [
                "fillfactor=80"]
        db.session.commit()
        downgrade(revision=BEFORE_MATCH_ID_ON_INTENTS)
        assert "match_id" not in {column["name"] for column in
                                  inspect(db.engine).get_columns("intents")}
        assert "ix_intents_id" in indexes("intents")
        assert "ix_seen_responses_intent_id" in indexes("seen_responses")
        assert db.session.execute(text("SELECT owner, match_id, intent_id FROM seen_responses")
                                  ).all() == [(owner, "m-1", 1)]
        if TEST_DATABASE_URL:  # the previous gate is back, and records a sighting itself
            row = db.session.execute(text(
                "SELECT reason FROM intentgate_verify(5, 'sha256:3', :owner, 'm-2', true, 5,"
                " 60, :tenant, :period, '2026-01-01', 1000, 'evt')"),
                {"owner": owner, "tenant": tenant_id, "period": billing_period()}).one()
            assert row == (None,)
            assert db.session.execute(text(
                "SELECT intent_id FROM seen_responses WHERE match_id = 'm-2'")).scalar_one() == 3
        db.session.commit()
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_COUNTER_SHARDS = "f3b5d7e9a162"
DAILY_COLUMNS = ("tenant_id, day, verifications, cleared, unknown_intent, expired_intent,"
                 " replayed_intent, invalid_signature, timestamp_out_of_window, replayed_response")


def test_counters_become_shard_0_and_the_downgrade_merges_the_shards(base_settings,
                                                                     empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def run(sql, **params):
        return db.session.execute(text(sql), {"tenant": tenant_id, **params})

    def rows(sql, **params):
        return run(sql, **params).all()

    with app.app_context():
        upgrade(revision=BEFORE_COUNTER_SHARDS)
        tenant_id = _old_tenant("shards@example.com")
        run("INSERT INTO monthly_usage (tenant_id, period, usage_count)"
            " VALUES (:tenant, :period, 7)", period=billing_period())
        run(f"INSERT INTO daily_usage ({DAILY_COLUMNS})"
            " VALUES (:tenant, :day, 7, 5, 2, 0, 0, 0, 0, 0)", day=f"{billing_period()}-01")
        db.session.commit()
        upgrade()
        assert rows("SELECT shard, usage_count FROM monthly_usage") == [(0, 7)]
        assert rows("SELECT shard, verifications FROM daily_usage") == [(0, 7)]
        # Counts other connections made on shards of their own.
        run("INSERT INTO monthly_usage (tenant_id, period, shard, usage_count)"
            " VALUES (:tenant, :period, 3, 4), (:tenant, :period, 12, 1)",
            period=billing_period())
        run(f"INSERT INTO daily_usage ({DAILY_COLUMNS}, shard)"
            " VALUES (:tenant, :first, 4, 4, 0, 0, 0, 0, 0, 0, 3),"
            " (:tenant, :second, 1, 0, 0, 0, 0, 1, 0, 0, 12)",
            first=f"{billing_period()}-01", second=f"{billing_period()}-02")
        db.session.commit()
        downgrade(revision=BEFORE_COUNTER_SHARDS)
        assert "shard" not in {column["name"] for column in
                               inspect(db.engine).get_columns("monthly_usage")}
        assert rows("SELECT period, usage_count FROM monthly_usage") == [(billing_period(), 12)]
        assert rows("SELECT day, verifications, cleared, unknown_intent, invalid_signature"
                    " FROM daily_usage ORDER BY day") == [
                                                          (f"{billing_period()}-01", 11, 9, 2, 0),
                                                          (f"{billing_period()}-02", 1, 0, 0, 1)]
        if TEST_DATABASE_URL:  # the previous gate is back, counting on the one row
            assert rows("SELECT reason, usage_count FROM intentgate_verify(5, 'sha256:none',"
                        " 'tenant:1', 'm', true, 5, 60, :tenant, :period, '2026-11-02', 1000,"
                        " 'evt')", period=billing_period()) == [("UnknownIntent", 13)]
        db.session.commit()
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_PAGES_FILLED_TO_65 = "a4c6e8f0b237"


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="a fillfactor is PostgreSQL's")
def test_intents_pages_are_filled_to_65_and_the_downgrade_restores_80(base_settings,
                                                                      empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def fill():
        options = db.session.execute(text(
            "SELECT reloptions FROM pg_class WHERE relname = 'intents'")).scalar_one()
        db.session.commit()
        return options

    with app.app_context():
        upgrade(revision=BEFORE_PAGES_FILLED_TO_65)
        assert fill() == ["fillfactor=80"]
        upgrade()
        assert fill() == ["fillfactor=65"]
        downgrade(revision=BEFORE_PAGES_FILLED_TO_65)
        assert fill() == ["fillfactor=80"]
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_NOT_MADE_INDEX = "b5d7f9a1c348"


def test_the_attempts_not_yet_made_get_an_index_and_the_downgrade_drops_it(base_settings,
                                                                         empty_database_url):
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def indexes():
        found = {index["name"] for index in inspect(db.engine).get_indexes("webhook_deliveries")}
        db.session.remove()
        return found

    with app.app_context():
        upgrade(revision=BEFORE_NOT_MADE_INDEX)
        assert "ix_webhook_deliveries_not_made" not in indexes()
        upgrade()
        assert "ix_webhook_deliveries_not_made" in indexes()
        downgrade(revision=BEFORE_NOT_MADE_INDEX)
        assert "ix_webhook_deliveries_not_made" not in indexes()
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_MONTHS_FROM_DAYS = "0c2e4f6a8b13"


def test_a_month_is_read_from_its_days_and_the_downgrade_counts_them_on_the_month(
        base_settings, empty_database_url):
    """Up: what a month counted before it counted days goes to its day 00. Down: what its days
    counted alone (an unlimited plan's verifications since) goes to its monthly_usage."""
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    period = billing_period()

    def run(sql, **params):
        return db.session.execute(text(sql), {"tenant": tenant_id, "period": period, **params})

    def rows(sql, **params):
        return run(sql, **params).all()

    def gate_exists():
        return bool(rows("SELECT 1 FROM pg_proc WHERE proname = 'intentgate_verification_gate'"))

    with app.app_context():
        upgrade(revision=BEFORE_MONTHS_FROM_DAYS)
        tenant_id = _old_tenant("days@example.com")
        # 7 counted this month, 5 of them on its days (2 before days were counted).
        run("INSERT INTO monthly_usage (tenant_id, period, shard, usage_count)"
            " VALUES (:tenant, :period, 0, 4), (:tenant, :period, 9, 3)")
        run(f"INSERT INTO daily_usage ({DAILY_COLUMNS}, shard)"
            " VALUES (:tenant, :day, 5, 5, 0, 0, 0, 0, 0, 0, 9)", day=f"{period}-01")
        db.session.commit()
        upgrade()
        assert rows("SELECT day, shard, verifications FROM daily_usage ORDER BY day") == [
            (f"{period}-00", 0, 2), (f"{period}-01", 9, 5)]
        if TEST_DATABASE_URL:
            assert gate_exists()
        # An unlimited plan's 6 verifications since, on their days alone.
        run(f"INSERT INTO daily_usage ({DAILY_COLUMNS}, shard)"
            " VALUES (:tenant, :day, 6, 6, 0, 0, 0, 0, 0, 0, 4)", day=f"{period}-02")
        db.session.commit()
        downgrade(revision=BEFORE_MONTHS_FROM_DAYS)
        assert rows("SELECT shard, usage_count FROM monthly_usage ORDER BY shard") == [
            (0, 4), (1, 6), (9, 3)]
        if TEST_DATABASE_URL:
            assert not gate_exists()
        # And up again: the month and its days agree, nothing is carried twice.
        db.session.commit()
        upgrade()
        assert rows("SELECT sum(verifications) FROM daily_usage") == [(13,)]
        assert rows("SELECT sum(usage_count) FROM monthly_usage") == [(13,)]
        db.session.commit()
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_ONE_VALUE_GATE = "b2d4f6a8c013"  # the revision before the gate answered one value


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="the gate's functions are PostgreSQL's")
def test_the_previous_releases_gate_answers_beside_the_one_value_gate(base_settings,
                                                                       empty_database_url):
    """During a rolling restart the previous release's workers call intentgate_verification_gate
    and intentgate_issue_intent: they stay, and the old gate judges as the new one does; the
    downgrade drops only the new functions."""
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    arguments = ("1, 'sha256:none', 'admin:1', 'm', true, 1, 60,"
                 " NULL, NULL, NULL, NULL, NULL, NULL, NULL")

    def gates():
        return [name for (name,) in db.session.execute(text(
            "SELECT proname FROM pg_proc WHERE proname IN ('intentgate_verification_gate',"
            " 'intentgate_verdict', 'intentgate_issue_intent', 'intentgate_issue')"
            " ORDER BY proname"))]

    with app.app_context():
        upgrade()
        assert db.session.execute(text(
            f"SELECT (SELECT reason FROM intentgate_verification_gate({arguments})),"
            f" intentgate_verdict({arguments})")).one() == ("UnknownIntent", "UnknownIntent")
        db.session.commit()
        downgrade(revision=BEFORE_ONE_VALUE_GATE)
        assert gates() == ["intentgate_issue_intent", "intentgate_verification_gate"]
        db.session.commit()
        upgrade()
        assert gates() == ["intentgate_issue", "intentgate_issue_intent", "intentgate_verdict",
                           "intentgate_verification_gate"]
        db.session.commit()
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="the trigger is PostgreSQL's")
def test_a_tenants_credentials_version_moves_on_at_every_update_and_never_comes_back(
        base_settings, empty_database_url):
    """A kept principal's fingerprint names it (app.tenants.keys): a value that came back after
    a downgrade and an upgrade would let an entry kept in Redis from before match a row changed
    since."""
    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def version():
        return db.session.execute(text("SELECT credentials_version FROM tenants")).scalar_one()

    def update(sql):
        db.session.execute(text(sql))
        db.session.commit()

    with app.app_context():
        upgrade()
        _old_tenant("versions@example.com")
        db.session.commit()
        seen = [version()]
        for _ in range(2):  # a write of the same value moves it too
            update("UPDATE tenants SET plan = 'free'")
            seen.append(version())
        db.session.commit()
        downgrade(revision="c4e6a8b0d217")
        db.session.commit()
        upgrade()
        seen.append(version())
        update("UPDATE tenants SET active = false")
        seen.append(version())
        assert seen == sorted(set(seen)), seen  # strictly increasing
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()


BEFORE_TENANT_LEADING_KEYS = "e5f9a3b72c48"  # f7a1c3e5b920 then swaps keys in autocommit blocks
STOPPED_BY_THE_LOCK = "a7c1e3f5b209"  # its UPDATE of api_keys waits at most 5 s for the table


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="PostgreSQL's locks and autocommit blocks")
def test_an_upgrade_stopped_by_a_lock_keeps_what_it_completed_and_completes_when_run_again(
        base_settings, empty_database_url):
    """A migration that committed in autocommit blocks, then a later one stopped by a lock in
    the same run: the version stamp stayed behind the schema, and every later upgrade failed
    (a probe: `constraint "fk_seen_responses_intent_id_intents" ... does not exist`)."""
    import psycopg2
    from sqlalchemy.engine import make_url

    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})

    def current():
        return db.session.execute(text("SELECT version_num FROM alembic_version")).scalar()

    with app.app_context():
        upgrade(revision=BEFORE_TENANT_LEADING_KEYS)
        db.session.remove()
        holding = psycopg2.connect(make_url(empty_database_url).set(
            drivername="postgresql").render_as_string(False))
        try:
            holding.cursor().execute("LOCK TABLE api_keys IN SHARE MODE")  # reads go on
            with pytest.raises(click.ClickException, match="waited 5s for a lock"):
                upgrade()
        finally:
            holding.rollback()
            holding.close()
        db.session.remove()
        stopped_at = current()
        db.session.remove()
        upgrade()  # the rest, from where it stopped
        assert current() == _head()
        db.session.remove()
        db.engine.dispose()
    app.extensions["database"].engine.dispose()
    assert stopped_at not in (BEFORE_TENANT_LEADING_KEYS, STOPPED_BY_THE_LOCK)


def _head():
    from alembic.script import ScriptDirectory
    from flask_migrate import Config

    config = Config()
    config.set_main_option("script_location", "migrations")
    return ScriptDirectory.from_config(config).get_current_head()


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="the gate's functions are PostgreSQL's")
def test_a_release_newer_than_its_database_answers_503_and_says_why(base_settings,
                                                                   empty_database_url, caplog):
    """Downgraded before the previous release was back: the gate's function is gone. The
    request was not at fault (a probe: 431 of 1,001 verifies answered 500), and the log names
    the fix."""
    from tests.conftest import _provision
    from tests.support import assert_envelope, scale_response

    app = create_app({**base_settings, "SQLALCHEMY_DATABASE_URI": empty_database_url})
    with app.app_context():
        upgrade()
        downgrade(revision=BEFORE_ONE_VALUE_GATE)
        made = _provision("enterprise")
        db.session.remove()
        db.engine.dispose()
    intent_hash = "sha256:" + "0" * 64
    answer = app.test_client().post(
        "/v1/intent/verify", headers={"X-Service-Key": made.api_key},
        json={"original_intent_hash": intent_hash,
              "response": scale_response(made.signing_secret, intent_hash)})
    assert_envelope(answer, 503, "service temporarily unavailable")
    assert "Retry-After" not in answer.headers  # the operator's to fix
    assert "the database lacks a function this release calls" in caplog.text
    app.extensions["database"].engine.dispose()
