"""match_id on intents: the gate's write to an intent is a HOT update, and the purge finds a
seen_responses row by its key

Revision ID: c2e4a6f8b135
Revises: d1f3a5c7e924
Create Date: 2026-11-24 01:00:00

A verify wrote four rows with eight index entries: the month's counter, the intent (a new
version with an entry in each of its four indexes, its pages being full), seen_responses (its
key and an index on intent_id, for the purge) and the day's counter. Now:
- intents pages are filled to 80 % (fillfactor) so that the consumed version fits beside the
  issued one: a HOT update, no index entry. Pages written before keep their fill; they are
  consumed or purged within the intents' lifetime.
- ix_intents_id goes: the purge selects by expiry and deletes by the key (owner, id).
- the consume also notes the match_id it records (no index on it, so the update stays HOT),
  and the purge deletes the seen_responses row by its key (owner, match_id) where intent_id is
  that intent's: ix_seen_responses_intent_id goes. Existing rows are carried over: each
  consumed intent gets the match_id of its own seen_responses row.
- intentgate_verify is recreated with the new consume (same arguments and result).
On PostgreSQL the column, the fill and the function change in one short transaction; the
carry-over then runs in batches of its own and the indexes are dropped CONCURRENTLY, so traffic
is never queued behind the upgrade (run the purge once it has finished).
The downgrade restores both indexes, the previous function and the fill, and drops the column;
seen_responses keeps every row either way.
"""
import sqlalchemy as sa
from alembic import op

revision = 'c2e4a6f8b135'
down_revision = 'd1f3a5c7e924'
branch_labels = None
depends_on = None

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
(UPDATE intents SET consumed_at=p_now, match_id=CASE WHEN (intents.expires_at IS NOT NULL AND p_now <= intents.expires_at AND intents.id IS NOT NULL AND NOT (NOT p_signature_ok) AND p_timestamp BETWEEN intents.issued_at - p_skew AND p_now + p_skew) THEN p_match_id END WHERE intents.intent_hash = p_intent_hash AND intents.owner = p_owner AND intents.consumed_at IS NULL AND (EXISTS (SELECT counted.usage_count 
FROM counted)) RETURNING intents.id, intents.match_id), 
sighting AS 
(INSERT INTO seen_responses (owner, match_id, intent_id) SELECT p_owner AS anon_11, consumed.match_id AS match_id, consumed.id AS id 
FROM consumed 
WHERE consumed.match_id IS NOT NULL ON CONFLICT DO NOTHING RETURNING seen_responses.intent_id), 
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
(INSERT INTO webhook_events (tenant_id, id, type, data, created_at, dedupe_key) SELECT p_tenant_id AS anon_12, p_event_id || '_' || CAST(usage_alerts.threshold AS TEXT) AS anon_13, 'usage.threshold' AS anon_14, '{"period":"' || p_period || '","rate_limit":' || CAST(p_plan_limit AS TEXT) || ',"threshold":' || CAST(usage_alerts.threshold AS TEXT) || ',"usage_count":' || CAST(counted.usage_count AS TEXT) || '}' AS anon_15, p_now AS anon_16, 'usage.threshold:' || p_period || ':' || CAST(usage_alerts.threshold AS TEXT) AS anon_17 
FROM usage_alerts, counted 
WHERE usage_alerts.tenant_id = p_tenant_id AND counted.usage_count = (p_plan_limit * usage_alerts.threshold + 99) / 100 ON CONFLICT DO NOTHING)
 SELECT verdict.reason, (SELECT counted.usage_count 
FROM counted) AS usage_count 
FROM verdict;
END
$function$"""

PREVIOUS_VERIFY_FUNCTION = """\
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


BATCH = 10_000


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        op.add_column("intents", sa.Column("match_id", sa.String(256), nullable=True))
        _carry_over()
        op.drop_index("ix_seen_responses_intent_id", table_name="seen_responses")
        op.drop_index("ix_intents_id", table_name="intents")
        return
    # One short transaction (a column without a default is a catalogue change) that gives way
    # rather than queue traffic behind it: if it times out, run the upgrade again.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE intents ADD COLUMN IF NOT EXISTS match_id VARCHAR(256)")
    op.execute("ALTER TABLE intents SET (fillfactor = 80)")
    op.execute(VERIFY_FUNCTION)
    # Then, outside it, the carry-over in batches (no lock held long) and the indexes dropped
    # without blocking writes. Run the purge only once the upgrade has finished.
    with op.get_context().autocommit_block():
        _carry_over()
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_seen_responses_intent_id")
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_intents_id")


def _carry_over():
    """Each consumed intent gets the match_id of its own seen_responses row (its intent_id),
    not that of another intent's replay of it; in batches of intent ids."""
    bind = op.get_bind()
    low, high = bind.exec_driver_sql(
        "SELECT min(intent_id), max(intent_id) FROM seen_responses").one()
    for start in range(low or 0, (high or -1) + 1, BATCH):
        bind.execute(sa.text(
            "UPDATE intents SET match_id = seen_responses.match_id FROM seen_responses"
            " WHERE seen_responses.owner = intents.owner"
            " AND seen_responses.intent_id = intents.id"
            " AND seen_responses.intent_id >= :start AND seen_responses.intent_id < :stop"),
            {"start": start, "stop": start + BATCH})


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PREVIOUS_VERIFY_FUNCTION)
        op.execute("ALTER TABLE intents RESET (fillfactor)")
    op.create_index("ix_intents_id", "intents", ["id"])
    op.create_index("ix_seen_responses_intent_id", "seen_responses", ["intent_id"])
    with op.batch_alter_table("intents") as batch_op:
        batch_op.drop_column("match_id")
