"""A kept principal's fingerprint names the tenant row's credentials_version, which a trigger
moves on at every UPDATE of the row, in place of an MD5 over the text of every credential column

Revision ID: d6f8a0c2e419
Revises: c4e6a8b0d217
Create Date: 2026-11-28 13:00:00

The gate and the intent-issuing function confirm a principal kept in Redis by comparing its
fingerprint with the database's (app.tenants.key_cache). Writing the tenant's and the key's
row as text and hashing it was 57,600 of a cleared verify's 559,600 instructions in
PostgreSQL (callgrind, bench/pg_instructions.py; issue 24). Now the fingerprint is
`<credentials_version>:<the key's scopes>`:
- tenants.credentials_version: a BEFORE UPDATE trigger sets it at every UPDATE of the row,
  whoever writes it (a service function, `secrets reseal`, an operator's SQL), to the
  microseconds of the clock or one more than before, whichever is more (a new row, and each
  row at the upgrade, starts at the clock's microseconds). So it never comes
  back to a value it had, not even after a downgrade and an upgrade within the life of an
  entry kept in Redis (whose fingerprint would otherwise match a row changed since);
- the key's scopes: the key's other columns never change (a rotation makes a new key), and its
  revocation and expiry are the lookup's own conditions.
An Ed25519 tenant's fingerprint is still an MD5 of it and its active public keys, now with a
separator between the two.

intentgate_key_principal, intentgate_verdict and intentgate_issue are replaced in place: their
arguments and results are the same, and a release calls all three, so the previous release's
workers, during a rolling restart, read and confirm fingerprints of one kind too. (Kept
principals from before are stale once and read afresh.) The functions of older releases keep
their MD5: with this release's lookup, their workers confirm nothing kept and look each
principal up, as on a miss. The downgrade puts back the definitions of a4c6e8f0b237 and
c4e6a8b0d217 and drops the trigger and the column. SQLite keeps no fingerprint: the column
only (0).
"""
import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = 'd6f8a0c2e419'
down_revision = 'c4e6a8b0d217'
branch_labels = None
depends_on = None

NOW_MICROSECONDS = "CAST(extract(epoch FROM clock_timestamp()) * 1000000 AS bigint)"

TRIGGER_FUNCTION = f"""\
CREATE FUNCTION intentgate_tenant_changed() RETURNS trigger LANGUAGE plpgsql AS $function$
BEGIN
  NEW.credentials_version := greatest(OLD.credentials_version + 1, {NOW_MICROSECONDS});
  RETURN NEW;
END
$function$"""

KEY_LOOKUP_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_key_principal(p_digest text, p_period text, p_now bigint)
RETURNS TABLE(id integer, email character varying, plan character varying, active boolean, signing_secret_sealed text, previous_signing_secret_sealed text, previous_signing_secret_expires_at bigint, signature_scheme character varying, previous_signature_scheme character varying, previous_scheme_valid_until bigint, api_key_id character varying, key_digest character varying, prefix character varying, scopes character varying, key_expires_at bigint, signing_public_keys text, usage_count bigint, fingerprint text) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY SELECT tenants.id, tenants.email, tenants.plan, tenants.active, tenants.signing_secret_sealed, tenants.previous_signing_secret_sealed, tenants.previous_signing_secret_expires_at, tenants.signature_scheme, tenants.previous_signature_scheme, tenants.previous_scheme_valid_until, api_keys.id AS api_key_id, api_keys.key_digest, api_keys.prefix, api_keys.scopes, api_keys.expires_at AS key_expires_at, (SELECT string_agg(signing_keys.public_key, ',' ORDER BY signing_keys.id) AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = tenants.id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)) AS signing_public_keys, CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = tenants.id AND month_shards.period = p_period) AS BIGINT) AS usage_count, CASE WHEN (tenants.signature_scheme = 'ed25519' OR tenants.previous_signature_scheme = 'ed25519') THEN md5(CAST(tenants.credentials_version AS TEXT) || ':' || api_keys.scopes || '|' || coalesce((SELECT string_agg(signing_keys.public_key, ',' ORDER BY signing_keys.id) AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = tenants.id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)), '')) ELSE CAST(tenants.credentials_version AS TEXT) || ':' || api_keys.scopes END AS fingerprint 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now);
END
$function$"""

VERIFY_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_verdict(p_now bigint, p_intent_hash text, p_owner text, p_match_id text, p_signature_ok boolean, p_timestamp bigint, p_skew bigint, p_tenant_id integer, p_period text, p_day text, p_plan_limit bigint, p_event_id text, p_digest text, p_fingerprint text)
RETURNS text LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
DECLARE
p_current text;
p_public_keys boolean;
p_usage_count bigint;
p_consumed_id bigint;
p_recorded_match_id text;
p_issued_at bigint;
p_expires_at bigint;
p_sighting bigint;
p_first_sighting boolean;
p_reason text;
BEGIN
IF p_tenant_id IS NOT NULL THEN
  PERFORM pg_advisory_xact_lock_shared(6782, p_tenant_id);
END IF;
IF p_fingerprint IS NOT NULL THEN
  SELECT CAST(tenants.credentials_version AS TEXT) || ':' || api_keys.scopes AS anon_1, tenants.signature_scheme = 'ed25519' OR tenants.previous_signature_scheme = 'ed25519' AS anon_2, CASE WHEN (tenants.plan = 'free') THEN 1000 WHEN (tenants.plan = 'starter') THEN 50000 WHEN (tenants.plan = 'pro') THEN 500000 END AS plan_limit 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now) INTO p_current, p_public_keys, p_plan_limit;
IF p_public_keys THEN
  SELECT md5(p_current || '|' || coalesce((SELECT string_agg(signing_keys.public_key, ',' ORDER BY signing_keys.id) AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = p_tenant_id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)), '')) AS md5_1 INTO p_current;
END IF;
IF p_current IS DISTINCT FROM p_fingerprint THEN
  RETURN 'stale';
END IF;
ELSIF p_tenant_id IS NOT NULL THEN
  SELECT CASE WHEN (tenants.plan = 'free') THEN 1000 WHEN (tenants.plan = 'starter') THEN 50000 WHEN (tenants.plan = 'pro') THEN 500000 END AS plan_limit 
FROM tenants 
WHERE tenants.id = p_tenant_id INTO p_plan_limit;
END IF;
IF p_plan_limit IS NOT NULL THEN
  INSERT INTO monthly_usage (tenant_id, period, shard, usage_count) SELECT p_tenant_id AS anon_1, p_period AS anon_2, 0 AS anon_3, 1 AS anon_4 
WHERE CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period AND month_shards.shard != 0) AS BIGINT) < p_plan_limit ON CONFLICT (tenant_id, period, shard) DO UPDATE SET usage_count = (monthly_usage.usage_count + 1) WHERE monthly_usage.usage_count + CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period AND month_shards.shard != 0) AS BIGINT) < p_plan_limit RETURNING monthly_usage.usage_count + CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period AND month_shards.shard != 0) AS BIGINT) AS usage_count INTO p_usage_count;
  IF p_usage_count IS NULL THEN
    RETURN 'over_limit';
  END IF;
  INSERT INTO webhook_events (tenant_id, id, type, data, created_at, dedupe_key) SELECT p_tenant_id AS anon_1, p_event_id || '_' || CAST(usage_alerts.threshold AS TEXT) AS anon_2, 'usage.threshold' AS anon_3, '{"period":"' || p_period || '","rate_limit":' || CAST(p_plan_limit AS TEXT) || ',"threshold":' || CAST(usage_alerts.threshold AS TEXT) || ',"usage_count":' || CAST(p_usage_count AS TEXT) || '}' AS anon_4, p_now AS anon_5, 'usage.threshold:' || p_period || ':' || CAST(usage_alerts.threshold AS TEXT) AS anon_6 
FROM usage_alerts 
WHERE usage_alerts.tenant_id = p_tenant_id AND p_usage_count = (p_plan_limit * usage_alerts.threshold + 99) / 100 ON CONFLICT DO NOTHING;
END IF;
UPDATE intents SET consumed_at=p_now, match_id=CASE WHEN (intents.expires_at IS NOT NULL AND p_now < intents.expires_at AND intents.id IS NOT NULL AND NOT (NOT p_signature_ok) AND p_timestamp BETWEEN intents.issued_at - p_skew AND p_now + p_skew) THEN p_match_id END WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner AND intents.consumed_at IS NULL RETURNING intents.id, intents.match_id, intents.issued_at, intents.expires_at INTO p_consumed_id, p_recorded_match_id, p_issued_at, p_expires_at;
IF p_consumed_id IS NULL THEN
  SELECT intents.issued_at, intents.expires_at 
FROM intents 
WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner INTO p_issued_at, p_expires_at;
END IF;
p_first_sighting := false;
IF p_recorded_match_id IS NOT NULL THEN
  INSERT INTO seen_responses (owner, match_id, intent_id) VALUES (p_owner, p_recorded_match_id, p_consumed_id) ON CONFLICT DO NOTHING RETURNING seen_responses.intent_id INTO p_sighting;
  p_first_sighting := FOUND;
END IF;
p_reason := CASE WHEN (p_expires_at IS NULL) THEN 'UnknownIntent' WHEN (p_now >= p_expires_at) THEN 'ExpiredIntent' WHEN (p_consumed_id IS NULL) THEN 'ReplayedIntent' WHEN (NOT p_signature_ok) THEN 'InvalidSignature' WHEN (p_timestamp NOT BETWEEN p_issued_at - p_skew AND p_now + p_skew) THEN 'TimestampOutOfWindow' WHEN (NOT p_first_sighting) THEN 'ReplayedResponse' END;
IF p_tenant_id IS NOT NULL THEN
  IF p_reason IS NULL THEN
    UPDATE daily_usage SET verifications=(daily_usage.verifications + 1), cleared=(daily_usage.cleared + 1) WHERE daily_usage.tenant_id = p_tenant_id AND daily_usage.day = p_day AND daily_usage.shard = mod(pg_backend_pid(), 16);
  ELSE
    UPDATE daily_usage SET verifications=(daily_usage.verifications + 1), cleared=(daily_usage.cleared + CASE WHEN (p_reason IS NULL) THEN 1 ELSE 0 END), unknown_intent=(daily_usage.unknown_intent + CASE WHEN (p_reason = 'UnknownIntent') THEN 1 ELSE 0 END), expired_intent=(daily_usage.expired_intent + CASE WHEN (p_reason = 'ExpiredIntent') THEN 1 ELSE 0 END), replayed_intent=(daily_usage.replayed_intent + CASE WHEN (p_reason = 'ReplayedIntent') THEN 1 ELSE 0 END), invalid_signature=(daily_usage.invalid_signature + CASE WHEN (p_reason = 'InvalidSignature') THEN 1 ELSE 0 END), timestamp_out_of_window=(daily_usage.timestamp_out_of_window + CASE WHEN (p_reason = 'TimestampOutOfWindow') THEN 1 ELSE 0 END), replayed_response=(daily_usage.replayed_response + CASE WHEN (p_reason = 'ReplayedResponse') THEN 1 ELSE 0 END) WHERE daily_usage.tenant_id = p_tenant_id AND daily_usage.day = p_day AND daily_usage.shard = mod(pg_backend_pid(), 16);
  END IF;
  IF NOT FOUND THEN
    INSERT INTO daily_usage (tenant_id, day, shard, verifications, cleared, unknown_intent, expired_intent, replayed_intent, invalid_signature, timestamp_out_of_window, replayed_response) VALUES (p_tenant_id, p_day, mod(pg_backend_pid(), 16), 1, CASE WHEN (p_reason IS NULL) THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'UnknownIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ExpiredIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ReplayedIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'InvalidSignature') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'TimestampOutOfWindow') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ReplayedResponse') THEN 1 ELSE 0 END) ON CONFLICT (tenant_id, day, shard) DO UPDATE SET verifications = (daily_usage.verifications + excluded.verifications), cleared = (daily_usage.cleared + excluded.cleared), unknown_intent = (daily_usage.unknown_intent + excluded.unknown_intent), expired_intent = (daily_usage.expired_intent + excluded.expired_intent), replayed_intent = (daily_usage.replayed_intent + excluded.replayed_intent), invalid_signature = (daily_usage.invalid_signature + excluded.invalid_signature), timestamp_out_of_window = (daily_usage.timestamp_out_of_window + excluded.timestamp_out_of_window), replayed_response = (daily_usage.replayed_response + excluded.replayed_response);
  END IF;
END IF;
RETURN p_reason;
END
$function$"""

ISSUE_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_issue(p_intent_hash text, p_owner text, p_intent_class text, p_issued_at bigint, p_expires_at bigint, p_digest text, p_now bigint, p_fingerprint text, p_tenant_id integer, p_period text, p_plan_limit bigint)
RETURNS boolean LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
DECLARE
p_current text;
p_public_keys boolean;
p_fits integer;
BEGIN
SELECT CAST(tenants.credentials_version AS TEXT) || ':' || api_keys.scopes AS anon_1, tenants.signature_scheme = 'ed25519' OR tenants.previous_signature_scheme = 'ed25519' AS anon_2 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now) INTO p_current, p_public_keys;
IF p_public_keys THEN
  SELECT md5(p_current || '|' || coalesce((SELECT string_agg(signing_keys.public_key, ',' ORDER BY signing_keys.id) AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = p_tenant_id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)), '')) AS md5_1 INTO p_current;
END IF;
IF p_current IS DISTINCT FROM p_fingerprint THEN
  RETURN false;
END IF;
IF p_plan_limit IS NOT NULL THEN
  SELECT 1 AS anon_1 
WHERE CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period) AS BIGINT) < p_plan_limit INTO p_fits;
  IF p_fits IS NULL THEN
    RETURN NULL;
  END IF;
END IF;
INSERT INTO intents (owner, intent_hash, intent_class, issued_at, expires_at) VALUES (p_owner, p_intent_hash, p_intent_class, p_issued_at, p_expires_at);
RETURN true;
END
$function$"""


def _earlier(revision):
    """An earlier migration of this directory: its frozen definitions, put back on downgrade."""
    (path,) = Path(__file__).parent.glob(f"{revision}_*.py")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        op.add_column("tenants", sa.Column("credentials_version", sa.BigInteger(),
                                           nullable=False, server_default="0"))
        return
    op.execute("SET LOCAL lock_timeout = '5s'")
    # A volatile default: the (small) table is rewritten, each row given the clock's value.
    op.execute("ALTER TABLE tenants ADD COLUMN credentials_version bigint NOT NULL"
               f" DEFAULT {NOW_MICROSECONDS}")
    op.execute(TRIGGER_FUNCTION)
    op.execute("CREATE TRIGGER tenants_credentials_version BEFORE UPDATE ON tenants"
               " FOR EACH ROW EXECUTE FUNCTION intentgate_tenant_changed()")
    op.execute(KEY_LOOKUP_FUNCTION)
    op.execute(VERIFY_FUNCTION)
    op.execute(ISSUE_FUNCTION)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("tenants") as batch:
            batch.drop_column("credentials_version")
        return
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(_earlier("a4c6e8f0b237").KEY_LOOKUP_FUNCTION)
    one_value = _earlier("c4e6a8b0d217")
    op.execute(one_value.VERIFY_FUNCTION)
    op.execute(one_value.ISSUE_FUNCTION)
    op.execute("DROP TRIGGER tenants_credentials_version ON tenants")
    op.execute("DROP FUNCTION intentgate_tenant_changed()")
    op.execute("ALTER TABLE tenants DROP COLUMN credentials_version")
