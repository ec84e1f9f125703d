"""Usage counter shards: a tenant's monthly_usage and daily_usage rows gain a shard in their
key, so one tenant's concurrent verifications stop queuing for one row's lock

Revision ID: b8d0f2a4c617
Revises: f3b5d7e9a162
Create Date: 2026-11-24 12:00:00

Every verification of a tenant updated the same two rows (the month's, the day's): under
concurrency the gate waited on their locks, and the waits cost the primary CPU (measured with
bench/saturation.py, one tenant's generate-and-verify pairs at 8 / 16 clients: 2,537 / 1,896
pairs/s at 0.57 / 0.79 ms of PostgreSQL CPU each on one row; 3,210 / 3,945 at 0.47 / 0.42
with the counts spread over shards). Now each verification counts on the row of its server
connection's shard (pg_backend_pid() modulo 16), and the readers sum the shards; a limited plan
counts its month on shard 0 alone, against the sum of all, so it never passes the plan.
- both tables gain `shard smallint NOT NULL DEFAULT 0` (existing rows are shard 0) and their
  primary keys become (tenant_id, period|day, shard): still led by the tenant (Citus);
- intentgate_verify and intentgate_tenant_by_key_digest are recreated to count and read so.
On PostgreSQL the column is added in one short transaction, the new keys' indexes are built
CONCURRENTLY, then one short transaction swaps the keys and the functions together.
The downgrade merges each tenant's shards into shard 0 (no count is lost) under a lock that
holds verifications back for that moment, restores the keys and the previous functions.
"""
import sqlalchemy as sa
from alembic import op

revision = 'b8d0f2a4c617'
down_revision = 'f3b5d7e9a162'
branch_labels = None
depends_on = None

COUNTS = ("verifications", "cleared", "unknown_intent", "expired_intent", "replayed_intent",
          "invalid_signature", "timestamp_out_of_window", "replayed_response")
# table: (the key's second column and its type, the counts)
TABLES = {
    "monthly_usage": (("period", sa.String(length=7)), ("usage_count",)),
    "daily_usage": (("day", sa.String(length=10)), COUNTS),
}

VERIFY_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_verify(p_now bigint, p_intent_hash text, p_owner text, p_match_id text, p_signature_ok boolean, p_timestamp bigint, p_skew bigint, p_tenant_id integer, p_period text, p_day text, p_plan_limit bigint, p_event_id text)
RETURNS TABLE(reason text, usage_count bigint) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
DECLARE
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
  IF p_plan_limit IS NULL THEN
    INSERT INTO monthly_usage (tenant_id, period, shard, usage_count) VALUES (p_tenant_id, p_period, mod(pg_backend_pid(), 16), 1) ON CONFLICT (tenant_id, period, shard) DO UPDATE SET usage_count = (monthly_usage.usage_count + 1);
  ELSE
    INSERT INTO monthly_usage (tenant_id, period, shard, usage_count) SELECT p_tenant_id AS anon_1, p_period AS anon_2, 0 AS anon_3, 1 AS anon_4 
WHERE CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period AND month_shards.shard != 0) AS BIGINT) < p_plan_limit ON CONFLICT (tenant_id, period, shard) DO UPDATE SET usage_count = (monthly_usage.usage_count + 1) WHERE monthly_usage.usage_count + CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period AND month_shards.shard != 0) AS BIGINT) < p_plan_limit RETURNING monthly_usage.usage_count + CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = p_tenant_id AND month_shards.period = p_period AND month_shards.shard != 0) AS BIGINT) AS usage_count INTO p_usage_count;
    IF p_usage_count IS NULL THEN
      RETURN;
    END IF;
    INSERT INTO webhook_events (tenant_id, id, type, data, created_at, dedupe_key) SELECT p_tenant_id AS anon_1, p_event_id || '_' || CAST(usage_alerts.threshold AS TEXT) AS anon_2, 'usage.threshold' AS anon_3, '{"period":"' || p_period || '","rate_limit":' || CAST(p_plan_limit AS TEXT) || ',"threshold":' || CAST(usage_alerts.threshold AS TEXT) || ',"usage_count":' || CAST(p_usage_count AS TEXT) || '}' AS anon_4, p_now AS anon_5, 'usage.threshold:' || p_period || ':' || CAST(usage_alerts.threshold AS TEXT) AS anon_6 
FROM usage_alerts 
WHERE usage_alerts.tenant_id = p_tenant_id AND p_usage_count = (p_plan_limit * usage_alerts.threshold + 99) / 100 ON CONFLICT DO NOTHING;
  END IF;
END IF;
UPDATE intents SET consumed_at=p_now, match_id=CASE WHEN (intents.expires_at IS NOT NULL AND p_now <= intents.expires_at AND intents.id IS NOT NULL AND NOT (NOT p_signature_ok) AND p_timestamp BETWEEN intents.issued_at - p_skew AND p_now + p_skew) THEN p_match_id END WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner AND intents.consumed_at IS NULL RETURNING intents.id, intents.match_id, intents.issued_at, intents.expires_at INTO p_consumed_id, p_recorded_match_id, p_issued_at, p_expires_at;
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
p_reason := CASE WHEN (p_expires_at IS NULL) THEN 'UnknownIntent' WHEN (p_now > p_expires_at) THEN 'ExpiredIntent' WHEN (p_consumed_id IS NULL) THEN 'ReplayedIntent' WHEN (NOT p_signature_ok) THEN 'InvalidSignature' WHEN (p_timestamp NOT BETWEEN p_issued_at - p_skew AND p_now + p_skew) THEN 'TimestampOutOfWindow' WHEN (NOT p_first_sighting) THEN 'ReplayedResponse' END;
IF p_tenant_id IS NOT NULL THEN
  INSERT INTO daily_usage (tenant_id, day, shard, verifications, cleared, unknown_intent, expired_intent, replayed_intent, invalid_signature, timestamp_out_of_window, replayed_response) VALUES (p_tenant_id, p_day, mod(pg_backend_pid(), 16), 1, CASE WHEN (p_reason IS NULL) THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'UnknownIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ExpiredIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ReplayedIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'InvalidSignature') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'TimestampOutOfWindow') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ReplayedResponse') THEN 1 ELSE 0 END) ON CONFLICT (tenant_id, day, shard) DO UPDATE SET verifications = (daily_usage.verifications + excluded.verifications), cleared = (daily_usage.cleared + excluded.cleared), unknown_intent = (daily_usage.unknown_intent + excluded.unknown_intent), expired_intent = (daily_usage.expired_intent + excluded.expired_intent), replayed_intent = (daily_usage.replayed_intent + excluded.replayed_intent), invalid_signature = (daily_usage.invalid_signature + excluded.invalid_signature), timestamp_out_of_window = (daily_usage.timestamp_out_of_window + excluded.timestamp_out_of_window), replayed_response = (daily_usage.replayed_response + excluded.replayed_response);
END IF;
reason := p_reason;
usage_count := p_usage_count;
RETURN NEXT;
END
$function$"""

KEY_LOOKUP_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_tenant_by_key_digest(p_digest text, p_period text, p_now bigint)
RETURNS TABLE(id integer, email character varying, plan character varying, active boolean, signing_secret_sealed text, previous_signing_secret_sealed text, previous_signing_secret_expires_at bigint, signature_scheme character varying, previous_signature_scheme character varying, previous_scheme_valid_until bigint, api_key_id character varying, key_digest character varying, prefix character varying, scopes character varying, usage_count bigint, signing_public_keys text) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY SELECT tenants.id, tenants.email, tenants.plan, tenants.active, tenants.signing_secret_sealed, tenants.previous_signing_secret_sealed, tenants.previous_signing_secret_expires_at, tenants.signature_scheme, tenants.previous_signature_scheme, tenants.previous_scheme_valid_until, api_keys.id AS api_key_id, api_keys.key_digest, api_keys.prefix, api_keys.scopes, CAST((SELECT coalesce(sum(month_shards.usage_count), 0) AS coalesce_1 
FROM monthly_usage AS month_shards 
WHERE month_shards.tenant_id = tenants.id AND month_shards.period = p_period) AS BIGINT) AS usage_count, (SELECT string_agg(signing_keys.public_key, ',') AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = tenants.id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)) AS signing_public_keys 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now);
END
$function$"""

PREVIOUS_VERIFY_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_verify(p_now bigint, p_intent_hash text, p_owner text, p_match_id text, p_signature_ok boolean, p_timestamp bigint, p_skew bigint, p_tenant_id integer, p_period text, p_day text, p_plan_limit bigint, p_event_id text)
RETURNS TABLE(reason text, usage_count bigint) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
DECLARE
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
  INSERT INTO monthly_usage (tenant_id, period, usage_count) VALUES (p_tenant_id, p_period, 1) ON CONFLICT (tenant_id, period) DO UPDATE SET usage_count = (monthly_usage.usage_count + 1) WHERE p_plan_limit IS NULL OR monthly_usage.usage_count < p_plan_limit RETURNING monthly_usage.usage_count INTO p_usage_count;
  IF p_usage_count IS NULL THEN
    RETURN;
  END IF;
  IF p_plan_limit IS NOT NULL THEN
    INSERT INTO webhook_events (tenant_id, id, type, data, created_at, dedupe_key) SELECT p_tenant_id AS anon_1, p_event_id || '_' || CAST(usage_alerts.threshold AS TEXT) AS anon_2, 'usage.threshold' AS anon_3, '{"period":"' || p_period || '","rate_limit":' || CAST(p_plan_limit AS TEXT) || ',"threshold":' || CAST(usage_alerts.threshold AS TEXT) || ',"usage_count":' || CAST(p_usage_count AS TEXT) || '}' AS anon_4, p_now AS anon_5, 'usage.threshold:' || p_period || ':' || CAST(usage_alerts.threshold AS TEXT) AS anon_6 
FROM usage_alerts 
WHERE usage_alerts.tenant_id = p_tenant_id AND p_usage_count = (p_plan_limit * usage_alerts.threshold + 99) / 100 ON CONFLICT DO NOTHING;
  END IF;
END IF;
UPDATE intents SET consumed_at=p_now, match_id=CASE WHEN (intents.expires_at IS NOT NULL AND p_now <= intents.expires_at AND intents.id IS NOT NULL AND NOT (NOT p_signature_ok) AND p_timestamp BETWEEN intents.issued_at - p_skew AND p_now + p_skew) THEN p_match_id END WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner AND intents.consumed_at IS NULL RETURNING intents.id, intents.match_id, intents.issued_at, intents.expires_at INTO p_consumed_id, p_recorded_match_id, p_issued_at, p_expires_at;
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
p_reason := CASE WHEN (p_expires_at IS NULL) THEN 'UnknownIntent' WHEN (p_now > p_expires_at) THEN 'ExpiredIntent' WHEN (p_consumed_id IS NULL) THEN 'ReplayedIntent' WHEN (NOT p_signature_ok) THEN 'InvalidSignature' WHEN (p_timestamp NOT BETWEEN p_issued_at - p_skew AND p_now + p_skew) THEN 'TimestampOutOfWindow' WHEN (NOT p_first_sighting) THEN 'ReplayedResponse' END;
IF p_tenant_id IS NOT NULL THEN
  INSERT INTO daily_usage (tenant_id, day, verifications, cleared, unknown_intent, expired_intent, replayed_intent, invalid_signature, timestamp_out_of_window, replayed_response) VALUES (p_tenant_id, p_day, 1, CASE WHEN (p_reason IS NULL) THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'UnknownIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ExpiredIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ReplayedIntent') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'InvalidSignature') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'TimestampOutOfWindow') THEN 1 ELSE 0 END, CASE WHEN (p_reason = 'ReplayedResponse') THEN 1 ELSE 0 END) ON CONFLICT (tenant_id, day) DO UPDATE SET verifications = (daily_usage.verifications + excluded.verifications), cleared = (daily_usage.cleared + excluded.cleared), unknown_intent = (daily_usage.unknown_intent + excluded.unknown_intent), expired_intent = (daily_usage.expired_intent + excluded.expired_intent), replayed_intent = (daily_usage.replayed_intent + excluded.replayed_intent), invalid_signature = (daily_usage.invalid_signature + excluded.invalid_signature), timestamp_out_of_window = (daily_usage.timestamp_out_of_window + excluded.timestamp_out_of_window), replayed_response = (daily_usage.replayed_response + excluded.replayed_response);
END IF;
reason := p_reason;
usage_count := p_usage_count;
RETURN NEXT;
END
$function$"""

PREVIOUS_KEY_LOOKUP_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_tenant_by_key_digest(p_digest text, p_period text, p_now bigint)
RETURNS TABLE(id integer, email character varying, plan character varying, active boolean, signing_secret_sealed text, previous_signing_secret_sealed text, previous_signing_secret_expires_at bigint, signature_scheme character varying, previous_signature_scheme character varying, previous_scheme_valid_until bigint, api_key_id character varying, key_digest character varying, prefix character varying, scopes character varying, usage_count bigint, signing_public_keys text) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY SELECT tenants.id, tenants.email, tenants.plan, tenants.active, tenants.signing_secret_sealed, tenants.previous_signing_secret_sealed, tenants.previous_signing_secret_expires_at, tenants.signature_scheme, tenants.previous_signature_scheme, tenants.previous_scheme_valid_until, api_keys.id AS api_key_id, api_keys.key_digest, api_keys.prefix, api_keys.scopes, monthly_usage.usage_count, (SELECT string_agg(signing_keys.public_key, ',') AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = tenants.id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)) AS signing_public_keys 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id LEFT OUTER JOIN monthly_usage ON monthly_usage.tenant_id = tenants.id AND monthly_usage.period = p_period 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now);
END
$function$"""


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        for table in TABLES:
            _copy(table, sharded=True)
        return
    # A column with a constant default is a catalogue change: one short transaction that gives
    # way rather than queue traffic behind it (if it times out, run the upgrade again).
    op.execute("SET LOCAL lock_timeout = '5s'")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS shard smallint NOT NULL "
                   "DEFAULT 0")
    with op.get_context().autocommit_block():
        for table, ((period, _), _) in TABLES.items():
            # An index a failed earlier run left (perhaps invalid) is built again.
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS pk_{table}_sharded")
            op.execute(f"CREATE UNIQUE INDEX CONCURRENTLY pk_{table}_sharded "
                       f"ON {table} (tenant_id, {period}, shard)")
    # The keys and the functions that count on them change in one short transaction.
    op.execute("SET LOCAL lock_timeout = '5s'")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY "
                   f"USING INDEX pk_{table}_sharded")
    op.execute(VERIFY_FUNCTION)
    op.execute(KEY_LOOKUP_FUNCTION)


def downgrade():
    postgresql = op.get_bind().dialect.name == "postgresql"
    if postgresql:  # no verification counts on a shard while they are merged
        op.execute("LOCK TABLE monthly_usage, daily_usage IN EXCLUSIVE MODE")
    for table, ((period, _), counts) in TABLES.items():
        added = ", ".join(f"{count} = {table}.{count} + excluded.{count}" for count in counts)
        sums = ", ".join(f"sum({count})" for count in counts)
        op.execute(f"INSERT INTO {table} (tenant_id, {period}, shard, {', '.join(counts)}) "
                   f"SELECT tenant_id, {period}, 0, {sums} FROM {table} WHERE shard <> 0 "
                   f"GROUP BY tenant_id, {period} "
                   f"ON CONFLICT (tenant_id, {period}, shard) DO UPDATE SET {added}")
        op.execute(f"DELETE FROM {table} WHERE shard <> 0")
        if postgresql:
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}")
            op.execute(f"ALTER TABLE {table} DROP COLUMN shard")
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY "
                       f"(tenant_id, {period})")
        else:
            _copy(table, sharded=False)
    if postgresql:
        op.execute(PREVIOUS_VERIFY_FUNCTION)
        op.execute(PREVIOUS_KEY_LOOKUP_FUNCTION)


def _copy(table, sharded):
    """SQLite changes a primary key by copying the table (batch mode's reflection would keep
    the old key on the copy)."""
    (period, period_type), counts = TABLES[table]
    key = ["tenant_id", period, "shard"] if sharded else ["tenant_id", period]
    shard = [sa.Column("shard", sa.SmallInteger(), server_default="0", nullable=False)]
    op.create_table(
        f"_{table}_copy",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column(period, period_type, nullable=False),
        *(shard if sharded else ()),
        *(sa.Column(count, sa.BigInteger(), nullable=False) for count in counts),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=f"fk_{table}_tenant_id_tenants", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint(*key, name=f"pk_{table}"),
    )
    columns = ", ".join(["tenant_id", period, *counts])
    op.execute(f"INSERT INTO _{table}_copy ({columns}) SELECT {columns} FROM {table}")
    op.drop_table(table)
    op.rename_table(f"_{table}_copy", table)
