"""API key scopes (least privilege); one entry per Ed25519 public key per tenant

Revision ID: a7c1e3f5b209
Revises: c6e8f0a2b146
Create Date: 2026-11-23 21:40:00

Every API key gains `scopes` (app.tenants.scopes). Keys that exist before this change hold every
scope, so they keep working unchanged; new keys hold what they are given. The key lookup
function returns the calling key's scopes (its return type changes, so it is dropped and
created again, in one transaction with the column).

A tenant could register the same public key twice (base64 and PEM, or a retried POST), and
revoking one entry left the key verifying. Registration now refuses a second entry; this revokes
the newer duplicates already stored, each with an entry in its tenant's audit log (actor `cli`),
leaving the oldest. The downgrade restores the previous function and keeps the column, nullable
(the previous release neither reads nor writes it): dropping it made the next upgrade give every
key, one narrowed to `intents` included, every scope. The upgrade then fills in only the keys
made meanwhile, which the previous release gave every power. Revoked duplicates stay revoked
(the key itself still verifies through the oldest entry).
"""
import json
import time

import sqlalchemy as sa
from alembic import op

revision = 'a7c1e3f5b209'
down_revision = 'c6e8f0a2b146'
branch_labels = None
depends_on = None

ALL_SCOPES = "intents usage:read keys:write signing:write webhooks:write"

signing_keys = sa.table("signing_keys", sa.column("tenant_id", sa.Integer),
                        sa.column("id", sa.String), sa.column("public_key", sa.String),
                        sa.column("created_at", sa.BigInteger),
                        sa.column("revoked_at", sa.BigInteger))
tenants = sa.table("tenants", sa.column("id", sa.Integer))
audit_log = sa.table("audit_log", sa.column("tenant_id", sa.Integer),
                     sa.column("id", sa.BigInteger), sa.column("at", sa.BigInteger),
                     sa.column("action", sa.String), sa.column("actor", sa.String),
                     sa.column("details", sa.Text))

KEY_LOOKUP_FUNCTION = """\
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

PREVIOUS_KEY_LOOKUP_FUNCTION = """\
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


def upgrade():
    # A downgrade keeps the column: the scopes it holds stay what they were.
    if "scopes" not in {column["name"] for column in sa.inspect(op.get_bind()).get_columns(
            "api_keys")}:
        with op.batch_alter_table("api_keys") as batch_op:
            batch_op.add_column(sa.Column("scopes", sa.String(100), nullable=True))
    op.execute(f"UPDATE api_keys SET scopes = '{ALL_SCOPES}' WHERE scopes IS NULL")
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.alter_column("scopes", existing_type=sa.String(100), nullable=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION intentgate_tenant_by_key_digest(text, text, bigint)")
        op.execute(KEY_LOOKUP_FUNCTION)
    _revoke_duplicate_public_keys()


def _revoke_duplicate_public_keys():
    connection = op.get_bind()
    now = int(time.time())
    active = connection.execute(
        sa.select(signing_keys.c.tenant_id, signing_keys.c.id, signing_keys.c.public_key)
        .where(signing_keys.c.revoked_at.is_(None))
        .order_by(signing_keys.c.created_at, signing_keys.c.id)
    ).all()
    kept = {}
    for key in active:
        original = kept.setdefault((key.tenant_id, key.public_key), key.id)
        if original == key.id:
            continue
        # The tenant row's lock orders this with the service's own audited changes.
        connection.execute(sa.select(tenants.c.id).where(tenants.c.id == key.tenant_id)
                           .with_for_update())
        connection.execute(
            signing_keys.update()
            .where(signing_keys.c.tenant_id == key.tenant_id, signing_keys.c.id == key.id)
            .values(revoked_at=now))
        next_id = connection.execute(
            sa.select(sa.func.coalesce(sa.func.max(audit_log.c.id), 0) + 1)
            .where(audit_log.c.tenant_id == key.tenant_id)
        ).scalar_one()
        connection.execute(audit_log.insert().values(
            tenant_id=key.tenant_id, id=next_id, at=now, action="signing_key.revoked",
            actor="cli", details=json.dumps({"key_id": key.id, "duplicate_of": original},
                                            sort_keys=True)))


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION intentgate_tenant_by_key_digest(text, text, bigint)")
        op.execute(PREVIOUS_KEY_LOOKUP_FUNCTION)
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.alter_column("scopes", existing_type=sa.String(100), nullable=True)
