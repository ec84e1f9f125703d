"""an index of the webhook attempts not yet made, by endpoint: the claim's check for an attempt
in flight

Revision ID: c8e0a2b4d617
Revises: b5d7f9a1c348
Create Date: 2026-11-27 10:15:00

An endpoint has one attempt in flight at a time (app.webhooks.delivery): each claim asks, for
the due attempts it considers, whether their endpoint has one leased. Through the endpoint's
index (tenant_id, endpoint_id, id) that walked the endpoint's whole history of attempts made
(kept 30 days); this one holds only the attempts not yet made, a few per endpoint.
A partial index of a table that a running worker writes: the downgrade drops it.
"""
import sqlalchemy as sa
from alembic import op

revision = 'c8e0a2b4d617'
down_revision = 'b5d7f9a1c348'
branch_labels = None
depends_on = None

NOT_MADE = sa.text("at IS NULL")


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_index("ix_webhook_deliveries_not_made", "webhook_deliveries",
                    ["tenant_id", "endpoint_id"], postgresql_where=NOT_MADE,
                    sqlite_where=NOT_MADE)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_index("ix_webhook_deliveries_not_made", table_name="webhook_deliveries")
