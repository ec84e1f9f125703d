"""Webhooks: endpoints, the events outbox, delivery attempts, usage alerts; the gate raises
usage.threshold

Revision ID: d1f3a5c7e924
Revises: e3a5c7d9f142
Create Date: 2026-11-23 22:00:00

New per-tenant tables (every key leads with tenant_id, for Citus). Every tenant gets the default
usage alerts (80 and 100 per cent of its plan). The verify function gains an argument (the id of
a usage.threshold event it may raise) and a CTE that inserts that event when the verification's
count crosses one of the tenant's thresholds: its signature changes, so it is dropped and
created again, in one transaction with the tables. The downgrade restores the previous function
and drops the tables (undelivered events are lost with them).
"""
import sqlalchemy as sa
from alembic import op

revision = 'd1f3a5c7e924'
down_revision = 'e3a5c7d9f142'
branch_labels = None
depends_on = None

PREVIOUS_VERIFY_ARGUMENTS = ("bigint, text, text, text, boolean, bigint, bigint, integer, text, "
                             "text, bigint")

VERIFY_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_verify(p_now bigint, p_intent_hash text, p_owner text, p_match_id text, p_signature_ok boolean, p_timestamp bigint, p_skew bigint, p_tenant_id integer, p_period text, p_day text, p_plan_limit bigint, p_event_id text)
RETURNS TABLE(reason text, usage_count bigint) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY WITH known AS 
(SELECT intents.issued_at AS issued_at, intents.expires_at AS expires_at 
FROM intents 
WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner), 
counted AS 
(INSERT INTO monthly_usage (tenant_id, period, usage_count) VALUES (p_tenant_id, p_period, 1) ON CONFLICT (tenant_id, period) DO UPDATE SET usage_count = (monthly_usage.usage_count + 1) WHERE p_plan_limit IS NULL OR monthly_usage.usage_count < p_plan_limit RETURNING monthly_usage.usage_count), 
consumed AS 
(UPDATE intents SET consumed_at=p_now WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner AND intents.consumed_at IS NULL AND (EXISTS (SELECT counted.usage_count 
FROM counted)) RETURNING intents.id), 
sighting AS 
(INSERT INTO seen_responses (owner, match_id, intent_id) SELECT p_owner AS anon_11, p_match_id AS anon_12, consumed.id AS id 
FROM consumed 
WHERE (SELECT known.expires_at 
FROM known) IS NOT NULL AND p_now <= (SELECT known.expires_at 
FROM known) AND consumed.id IS NOT NULL AND NOT (NOT p_signature_ok) AND p_timestamp BETWEEN (SELECT known.issued_at 
FROM known) - p_skew AND p_now + p_skew ON CONFLICT DO NOTHING RETURNING seen_responses.intent_id), 
verdict AS 
(SELECT CASE WHEN ((SELECT known.expires_at 
FROM known) IS NULL) THEN 'UnknownIntent' WHEN (p_now > (SELECT known.expires_at 
FROM known)) THEN 'ExpiredIntent' WHEN ((SELECT consumed.id 
FROM consumed) IS NULL) THEN 'ReplayedIntent' WHEN (NOT p_signature_ok) THEN 'InvalidSignature' WHEN (p_timestamp NOT BETWEEN (SELECT known.issued_at 
FROM known) - p_skew AND p_now + p_skew) THEN 'TimestampOutOfWindow' WHEN (NOT (EXISTS (SELECT sighting.intent_id 
FROM sighting))) THEN 'ReplayedResponse' END AS reason), 
daily AS 
(INSERT INTO daily_usage (tenant_id, day, verifications, cleared, unknown_intent, expired_intent, replayed_intent, invalid_signature, timestamp_out_of_window, replayed_response) SELECT p_tenant_id AS anon_1, p_day AS anon_2, 1 AS anon_3, CASE WHEN (verdict.reason IS NULL) THEN 1 ELSE 0 END AS anon_4, CASE WHEN (verdict.reason = 'UnknownIntent') THEN 1 ELSE 0 END AS anon_5, CASE WHEN (verdict.reason = 'ExpiredIntent') THEN 1 ELSE 0 END AS anon_6, CASE WHEN (verdict.reason = 'ReplayedIntent') THEN 1 ELSE 0 END AS anon_7, CASE WHEN (verdict.reason = 'InvalidSignature') THEN 1 ELSE 0 END AS anon_8, CASE WHEN (verdict.reason = 'TimestampOutOfWindow') THEN 1 ELSE 0 END AS anon_9, CASE WHEN (verdict.reason = 'ReplayedResponse') THEN 1 ELSE 0 END AS anon_10 
FROM verdict 
WHERE EXISTS (SELECT counted.usage_count 
FROM counted) ON CONFLICT (tenant_id, day) DO UPDATE SET verifications = (daily_usage.verifications + excluded.verifications), cleared = (daily_usage.cleared + excluded.cleared), unknown_intent = (daily_usage.unknown_intent + excluded.unknown_intent), expired_intent = (daily_usage.expired_intent + excluded.expired_intent), replayed_intent = (daily_usage.replayed_intent + excluded.replayed_intent), invalid_signature = (daily_usage.invalid_signature + excluded.invalid_signature), timestamp_out_of_window = (daily_usage.timestamp_out_of_window + excluded.timestamp_out_of_window), replayed_response = (daily_usage.replayed_response + excluded.replayed_response)), 
alerted AS 
(INSERT INTO webhook_events (tenant_id, id, type, data, created_at, dedupe_key) SELECT p_tenant_id AS anon_13, p_event_id || '_' || CAST(usage_alerts.threshold AS TEXT) AS anon_14, 'usage.threshold' AS anon_15, '{"period":"' || p_period || '","rate_limit":' || CAST(p_plan_limit AS TEXT) || ',"threshold":' || CAST(usage_alerts.threshold AS TEXT) || ',"usage_count":' || CAST(counted.usage_count AS TEXT) || '}' AS anon_16, p_now AS anon_17, 'usage.threshold:' || p_period || ':' || CAST(usage_alerts.threshold AS TEXT) AS anon_18 
FROM usage_alerts, counted 
WHERE usage_alerts.tenant_id = p_tenant_id AND counted.usage_count = (p_plan_limit * usage_alerts.threshold + 99) / 100 ON CONFLICT DO NOTHING)
 SELECT verdict.reason, (SELECT counted.usage_count 
FROM counted) AS usage_count 
FROM verdict;
END
$function$"""

PREVIOUS_VERIFY_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_verify(p_now bigint, p_intent_hash text, p_owner text, p_match_id text, p_signature_ok boolean, p_timestamp bigint, p_skew bigint, p_tenant_id integer, p_period text, p_day text, p_plan_limit bigint)
RETURNS TABLE(reason text, usage_count bigint) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY WITH known AS 
(SELECT intents.issued_at AS issued_at, intents.expires_at AS expires_at 
FROM intents 
WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner), 
counted AS 
(INSERT INTO monthly_usage (tenant_id, period, usage_count) VALUES (p_tenant_id, p_period, 1) ON CONFLICT (tenant_id, period) DO UPDATE SET usage_count = (monthly_usage.usage_count + 1) WHERE p_plan_limit IS NULL OR monthly_usage.usage_count < p_plan_limit RETURNING monthly_usage.usage_count), 
consumed AS 
(UPDATE intents SET consumed_at=p_now WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner AND intents.consumed_at IS NULL AND (EXISTS (SELECT counted.usage_count 
FROM counted)) RETURNING intents.id), 
sighting AS 
(INSERT INTO seen_responses (owner, match_id, intent_id) SELECT p_owner AS anon_11, p_match_id AS anon_12, consumed.id AS id 
FROM consumed 
WHERE (SELECT known.expires_at 
FROM known) IS NOT NULL AND p_now <= (SELECT known.expires_at 
FROM known) AND consumed.id IS NOT NULL AND NOT (NOT p_signature_ok) AND p_timestamp BETWEEN (SELECT known.issued_at 
FROM known) - p_skew AND p_now + p_skew ON CONFLICT DO NOTHING RETURNING seen_responses.intent_id), 
verdict AS 
(SELECT CASE WHEN ((SELECT known.expires_at 
FROM known) IS NULL) THEN 'UnknownIntent' WHEN (p_now > (SELECT known.expires_at 
FROM known)) THEN 'ExpiredIntent' WHEN ((SELECT consumed.id 
FROM consumed) IS NULL) THEN 'ReplayedIntent' WHEN (NOT p_signature_ok) THEN 'InvalidSignature' WHEN (p_timestamp NOT BETWEEN (SELECT known.issued_at 
FROM known) - p_skew AND p_now + p_skew) THEN 'TimestampOutOfWindow' WHEN (NOT (EXISTS (SELECT sighting.intent_id 
FROM sighting))) THEN 'ReplayedResponse' END AS reason), 
daily AS 
(INSERT INTO daily_usage (tenant_id, day, verifications, cleared, unknown_intent, expired_intent, replayed_intent, invalid_signature, timestamp_out_of_window, replayed_response) SELECT p_tenant_id AS anon_1, p_day AS anon_2, 1 AS anon_3, CASE WHEN (verdict.reason IS NULL) THEN 1 ELSE 0 END AS anon_4, CASE WHEN (verdict.reason = 'UnknownIntent') THEN 1 ELSE 0 END AS anon_5, CASE WHEN (verdict.reason = 'ExpiredIntent') THEN 1 ELSE 0 END AS anon_6, CASE WHEN (verdict.reason = 'ReplayedIntent') THEN 1 ELSE 0 END AS anon_7, CASE WHEN (verdict.reason = 'InvalidSignature') THEN 1 ELSE 0 END AS anon_8, CASE WHEN (verdict.reason = 'TimestampOutOfWindow') THEN 1 ELSE 0 END AS anon_9, CASE WHEN (verdict.reason = 'ReplayedResponse') THEN 1 ELSE 0 END AS anon_10 
FROM verdict 
WHERE EXISTS (SELECT counted.usage_count 
FROM counted) ON CONFLICT (tenant_id, day) DO UPDATE SET verifications = (daily_usage.verifications + excluded.verifications), cleared = (daily_usage.cleared + excluded.cleared), unknown_intent = (daily_usage.unknown_intent + excluded.unknown_intent), expired_intent = (daily_usage.expired_intent + excluded.expired_intent), replayed_intent = (daily_usage.replayed_intent + excluded.replayed_intent), invalid_signature = (daily_usage.invalid_signature + excluded.invalid_signature), timestamp_out_of_window = (daily_usage.timestamp_out_of_window + excluded.timestamp_out_of_window), replayed_response = (daily_usage.replayed_response + excluded.replayed_response))
 SELECT verdict.reason, (SELECT counted.usage_count 
FROM counted) AS usage_count 
FROM verdict;
END
$function$"""


def upgrade():
    op.create_table(
        "webhook_endpoints",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("events", sa.String(1000), nullable=False),
        sa.Column("secret_sealed", sa.Text(), nullable=False),
        sa.Column("previous_secret_sealed", sa.Text(), nullable=True),
        sa.Column("previous_secret_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE",
                                name=op.f("fk_webhook_endpoints_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_webhook_endpoints")),
    )
    op.create_table(
        "webhook_events",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(48), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("endpoint_id", sa.String(32), nullable=True),
        sa.Column("dedupe_key", sa.String(120), nullable=True),
        sa.Column("dispatched_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE",
                                name=op.f("fk_webhook_events_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_webhook_events")),
        sa.UniqueConstraint("tenant_id", "dedupe_key", name="uq_webhook_events_tenant_dedupe"),
    )
    op.create_index("ix_webhook_events_undispatched", "webhook_events",
                    ["dispatched_at", "created_at"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(48), nullable=False),
        sa.Column("endpoint_id", sa.String(32), nullable=False),
        sa.Column("event_id", sa.String(48), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("scheduled_at", sa.BigInteger(), nullable=False),
        sa.Column("leased_until", sa.BigInteger(), nullable=True),
        sa.Column("lease_token", sa.String(32), nullable=True),
        sa.Column("at", sa.BigInteger(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(200), nullable=True),
        sa.Column("delivered", sa.Boolean(), nullable=False),
        sa.Column("next_attempt_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id", "endpoint_id"],
                                ["webhook_endpoints.tenant_id", "webhook_endpoints.id"],
                                name="fk_webhook_deliveries_endpoint", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["at", "scheduled_at"])
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries",
                    ["tenant_id", "endpoint_id", "id"])
    op.create_table(
        "usage_alerts",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("threshold", sa.Integer(), autoincrement=False, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE",
                                name=op.f("fk_usage_alerts_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", "threshold", name=op.f("pk_usage_alerts")),
    )
    for threshold in (80, 100):  # the contract's default, for every tenant there is
        op.execute(f"INSERT INTO usage_alerts (tenant_id, threshold) SELECT id, {threshold}"
                   " FROM tenants")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION intentgate_verify({PREVIOUS_VERIFY_ARGUMENTS})")
        op.execute(VERIFY_FUNCTION)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION intentgate_verify(%s, text)" % PREVIOUS_VERIFY_ARGUMENTS)
        op.execute(PREVIOUS_VERIFY_FUNCTION)
    op.drop_table("usage_alerts")
    op.drop_index("ix_webhook_deliveries_endpoint", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_events_undispatched", table_name="webhook_events")
    op.drop_table("webhook_events")
    op.drop_table("webhook_endpoints")
