"""The key lookup also answers the key's expiry, so a principal kept in Redis is not used past it

Revision ID: a4c6e8f0b237
Revises: f1a3c5e7b924
Create Date: 2026-11-27 04:00:00

A generate asks the context store before its write confirms a kept principal
(app.tenants.key_cache). A key that expired while its principal was kept would have sent one
user token to the store before the write refused it. intentgate_key_principal (new) is the key
lookup of intentgate_principal_by_key_digest with the key's expires_at beside its columns: the
cache keeps an entry no longer than the key lives and ignores one past it. A function only,
nothing replaced: workers of the previous release, during a rolling restart, keep calling
intentgate_principal_by_key_digest, which stays as it was (their kept principals, of another
shape, are misses to this release). The downgrade drops the function. Nothing to do on SQLite.
"""
from alembic import op

revision = 'a4c6e8f0b237'
down_revision = 'f1a3c5e7b924'
branch_labels = None
depends_on = None

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
WHERE month_shards.tenant_id = tenants.id AND month_shards.period = p_period) AS BIGINT) AS usage_count, CASE WHEN (tenants.signature_scheme = 'ed25519' OR tenants.previous_signature_scheme = 'ed25519') THEN md5(md5(CAST((tenants.id, tenants.email, tenants.plan, tenants.active, tenants.signing_secret_sealed, tenants.previous_signing_secret_sealed, tenants.previous_signing_secret_expires_at, tenants.signature_scheme, tenants.previous_signature_scheme, tenants.previous_scheme_valid_until, api_keys.id, api_keys.key_digest, api_keys.prefix, api_keys.scopes) AS TEXT)) || coalesce((SELECT string_agg(signing_keys.public_key, ',' ORDER BY signing_keys.id) AS string_agg_1 
FROM signing_keys 
WHERE signing_keys.tenant_id = tenants.id AND signing_keys.revoked_at IS NULL AND (signing_keys.expires_at IS NULL OR signing_keys.expires_at > p_now)), '')) ELSE md5(CAST((tenants.id, tenants.email, tenants.plan, tenants.active, tenants.signing_secret_sealed, tenants.previous_signing_secret_sealed, tenants.previous_signing_secret_expires_at, tenants.signature_scheme, tenants.previous_signature_scheme, tenants.previous_scheme_valid_until, api_keys.id, api_keys.key_digest, api_keys.prefix, api_keys.scopes) AS TEXT)) END AS fingerprint 
FROM api_keys JOIN tenants ON tenants.id = api_keys.tenant_id 
WHERE api_keys.key_digest = p_digest AND api_keys.revoked_at IS NULL AND (api_keys.expires_at IS NULL OR api_keys.expires_at > p_now);
END
$function$"""


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(KEY_LOOKUP_FUNCTION)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP FUNCTION intentgate_key_principal(text, text, bigint)")
