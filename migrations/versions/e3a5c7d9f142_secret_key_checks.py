"""secret_key_checks: which encryption keys sealed the stored secrets (check values, never keys)

Revision ID: e3a5c7d9f142
Revises: a7c1e3f5b209
Create Date: 2026-11-23 21:30:00

SECRET_ENCRYPTION_KEY becomes a key ring. Each key that sealed a secret here is recorded by its
check value (HMAC-SHA256 of a fixed text under the key, app.keyring.ring), so a process whose
ring lacks one refuses to start instead of sealing secrets no other process can unseal (local
mode's generated key writing into a production database). A database that already holds
secrets gets its values when `flask db upgrade` ends (migrations/env.py): from the keys of the
ring that unseal its newest secrets; with none that does, the upgrade is refused.
"""
import sqlalchemy as sa
from alembic import op

revision = 'e3a5c7d9f142'
down_revision = 'a7c1e3f5b209'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'secret_key_checks',
        sa.Column('check_value', sa.String(length=64), nullable=False),
        sa.Column('recorded_at', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('check_value', name=op.f('pk_secret_key_checks')),
    )


def downgrade():
    op.drop_table('secret_key_checks')
