"""intents pages are filled to 65 %, so that a page's consumed versions fit beside its issued ones
under concurrent verifies

Revision ID: b5d7f9a1c348
Revises: a4c6e8f0b237
Create Date: 2026-11-27 07:00:00

A verify's write to an intent is a HOT update only when the consumed version (consumed_at and
the match_id it records: some 40-60 bytes more than the issued one) fits on the intent's own
page. At 80 % a page had room for about eight of its forty-odd intents; the rest relied on
PostgreSQL pruning the page's older versions as verifies went, which it skips while another
backend holds the page (concurrent verifies of intents issued together do) or an older
snapshot still sees them. Measured with pgbench (five clients verifying 800,000 stored intents,
real-sized hashes): one verify in ten was not a HOT update, each adding an entry to all three of
the intents' indexes, most of them a full-page image after a checkpoint; WAL per verify 1,530
bytes at 80 %, 835 at 65 % (every consume a HOT update), the same at 50 %. The table is about a
fifth larger for the intents' lifetime. Pages written before keep their fill.
ALTER TABLE ... SET (fillfactor) takes a SHARE UPDATE EXCLUSIVE lock: reads and writes go on.
The downgrade restores 80 %. Nothing to do on SQLite.
"""
from alembic import op

revision = 'b5d7f9a1c348'
down_revision = 'a4c6e8f0b237'
branch_labels = None
depends_on = None


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SET LOCAL lock_timeout = '5s'")
        op.execute("ALTER TABLE intents SET (fillfactor = 65)")


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SET LOCAL lock_timeout = '5s'")
        op.execute("ALTER TABLE intents SET (fillfactor = 80)")
