"""request-path functions give up a lock wait after 5 s (a 503 within the request budget)

Revision ID: c6e8f0a2b146
Revises: b3d5f7a9c024
Create Date: 2026-11-23 18:10:00

Until now a verify whose row another transaction held (an operator's open transaction on the
month's usage row, a migration's table lock) waited inside PostgreSQL with no bound: gunicorn's
worker timeout stopped the request at 40 s, past SPEC.md's 30 s budget, and the statement could
still commit afterwards, consuming an intent whose verdict nobody received. The functions now
carry `SET lock_timeout` (app.database.LOCK_TIMEOUT): the statement is aborted after 5 s of
waiting, nothing of it is written, and the caller gets a 503 with Retry-After. The setting
lasts for the call only, so PgBouncer in transaction mode is unaffected. The bodies are those of
e5f9a3b72c48; tests/test_database_functions.py holds these texts to the code.
"""
from alembic import op

revision = 'c6e8f0a2b146'
down_revision = 'b3d5f7a9c024'
branch_labels = None
depends_on = None

KEY_LOOKUP_FUNCTION = """\
CREATE OR REPLACE FUNCTION intentgate_tenant_by_key_digest(p_digest text, p_period text, p_now bigint)
RETURNS TABLE(id integer, email character varying, plan character varying, active boolean, signing_secret_sealed text, previous_signing_secret_sealed text, previous_signing_secret_expires_at bigint, signature_scheme character varying, previous_signature_scheme character varying, previous_scheme_valid_until bigint, api_key_id character varying, key_digest character varying, prefix character varying, usage_count bigint, signing_public_keys text) LANGUAGE plpgsql
SET lock_timeout = '5s' AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY SELECT tenants.id, tenants.email, tenants.plan, tenants.active, tenants.signing_secret_sealed, tenants.previous_signing_secret_sealed, tenants.previous_signing_secret_expires_at, tenants.signature_scheme, tenants.previous_signature_scheme, tenants.previous_scheme_valid_until, api_keys.id AS api_key_id, api_keys.key_digest, api_keys.prefix, monthly_usage.usage_count, (SELECT string_agg(signing_keys.public_key, ',') AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = tenants.id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)) AS signing_public_keys 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id LEFT OUTER JOIN monthly_usage ON monthly_usage.tenant_id = tenants.id AND monthly_usage.period = p_period 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now);
END
$function$"""

VERIFY_FUNCTION = """\
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
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(KEY_LOOKUP_FUNCTION)
    op.execute(VERIFY_FUNCTION)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER FUNCTION intentgate_tenant_by_key_digest RESET lock_timeout")
    op.execute("ALTER FUNCTION intentgate_verify RESET lock_timeout")
