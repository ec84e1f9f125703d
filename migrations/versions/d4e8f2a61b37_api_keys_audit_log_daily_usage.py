"""api keys as their own table (existing keys carried over), audit log, daily usage

Revision ID: d4e8f2a61b37
Revises: 3b7c1d2e4f60
Create Date: 2026-11-22 01:10:00

Every key that worked before the upgrade works after it: each tenant's digest and prefix become
its first row of api_keys (named "default"), with no step for the tenant. The plaintext was never
stored, so nothing else is needed. Downgrade keeps each tenant's newest active key.
"""
import secrets
import time

from alembic import op
import sqlalchemy as sa


revision = 'd4e8f2a61b37'
down_revision = '3b7c1d2e4f60'
branch_labels = None
depends_on = None

DAILY_COUNTS = ('verifications', 'cleared', 'unknown_intent', 'expired_intent', 'replayed_intent',
                'invalid_signature', 'timestamp_out_of_window', 'replayed_response')


def upgrade():
    op.create_table(
        'api_keys',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=100), nullable=False),
        sa.Column('key_digest', sa.String(length=64), nullable=False),
        sa.Column('prefix', sa.String(length=16), nullable=False),
        sa.Column('created_at', sa.BigInteger(), nullable=False),
        sa.Column('expires_at', sa.BigInteger(), nullable=True),
        sa.Column('revoked_at', sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'],
                                name=op.f('fk_api_keys_tenant_id_tenants'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
        sa.UniqueConstraint('key_digest', name=op.f('uq_api_keys_key_digest')),
    )
    op.create_index(op.f('ix_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False)
    connection = op.get_bind()
    existing = connection.execute(sa.text(
        "SELECT id, api_key_digest, api_key_prefix FROM tenants")).fetchall()
    now = int(time.time())
    api_keys = sa.table('api_keys', *(sa.column(name) for name in (
        'id', 'tenant_id', 'name', 'key_digest', 'prefix', 'created_at')))
    if existing:
        op.bulk_insert(api_keys, [
            {'id': 'ak_' + secrets.token_hex(12), 'tenant_id': tenant_id, 'name': 'default',
             'key_digest': digest, 'prefix': prefix, 'created_at': now}
            for tenant_id, digest, prefix in existing])
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_constraint('uq_tenants_api_key_digest', type_='unique')
        batch_op.drop_column('api_key_digest')
        batch_op.drop_column('api_key_prefix')

    op.create_table(
        'audit_log',
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('at', sa.BigInteger(), nullable=False),
        sa.Column('action', sa.String(length=40), nullable=False),
        sa.Column('actor', sa.String(length=120), nullable=False),
        sa.Column('request_id', sa.String(length=128), nullable=True),
        sa.Column('address', sa.String(length=64), nullable=True),
        sa.Column('details', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'],
                                name=op.f('fk_audit_log_tenant_id_tenants'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('tenant_id', 'id', name=op.f('pk_audit_log')),
    )
    op.create_table(
        'daily_usage',
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('day', sa.String(length=10), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in DAILY_COUNTS),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'],
                                name=op.f('fk_daily_usage_tenant_id_tenants'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('tenant_id', 'day', name=op.f('pk_daily_usage')),
    )


def downgrade():
    op.drop_table('daily_usage')
    op.drop_table('audit_log')
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('api_key_digest', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('api_key_prefix', sa.String(length=16), nullable=True))
    op.execute(sa.text(
        "UPDATE tenants SET api_key_digest = (SELECT key_digest FROM api_keys"
        " WHERE api_keys.tenant_id = tenants.id AND revoked_at IS NULL"
        " ORDER BY created_at DESC LIMIT 1),"
        " api_key_prefix = (SELECT prefix FROM api_keys WHERE api_keys.tenant_id = tenants.id"
        " AND revoked_at IS NULL ORDER BY created_at DESC LIMIT 1)"))
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.create_unique_constraint('uq_tenants_api_key_digest', ['api_key_digest'])
    op.drop_index(op.f('ix_api_keys_tenant_id'), table_name='api_keys')
    op.drop_table('api_keys')
