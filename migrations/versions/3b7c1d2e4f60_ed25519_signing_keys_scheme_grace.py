"""ed25519 signing keys; the previous signature scheme and its grace

Revision ID: 3b7c1d2e4f60
Revises: e9624243421a
Create Date: 2026-11-22 01:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '3b7c1d2e4f60'
down_revision = 'e9624243421a'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'signing_keys',
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('name', sa.String(length=100), nullable=True),
        sa.Column('public_key', sa.String(length=44), nullable=False),
        sa.Column('created_at', sa.BigInteger(), nullable=False),
        sa.Column('expires_at', sa.BigInteger(), nullable=True),
        sa.Column('revoked_at', sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'],
                                name=op.f('fk_signing_keys_tenant_id_tenants'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('tenant_id', 'id', name=op.f('pk_signing_keys')),
    )
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('previous_signature_scheme', sa.String(length=16),
                                      nullable=True))
        batch_op.add_column(sa.Column('previous_scheme_valid_until', sa.BigInteger(),
                                      nullable=True))


def downgrade():
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('previous_scheme_valid_until')
        batch_op.drop_column('previous_signature_scheme')
    op.drop_table('signing_keys')
