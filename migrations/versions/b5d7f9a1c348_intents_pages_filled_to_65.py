"""intents pages are filled to 65 %, so that every intent of a page fits on it in its consumed form

Revision ID: b5d7f9a1c348
Revises: a4c6e8f0b237
Create Date: 2026-11-27 07:00:00

A verify's write to an intent is a HOT update only when the consumed version fits on the
intent's own page. It is some 48 bytes larger than the issued one (consumed_at, and the match_id
it records: a uuid's 32-36 characters from the SDKs), about 196 bytes against 148. At 80 % a page
holds some 42 issued intents, and 42 consumed versions do not fit in 8 KB even once PostgreSQL
has pruned every older version: the page's last few consumes went elsewhere, an entry in each
of the intents' three indexes, most of them a full-page image after a checkpoint. Measured: one
consume in eleven was no HOT update when verified one at a time through the service (262 of
2,903), one in ten with five pgbench clients (800,000 stored intents, real-sized hashes). At
65 % (some 35 intents) every consume was a HOT update, and WAL per verify fell from 1,530 to
835 bytes (50 % gives the same). The room left also holds a dozen consumed versions before
any pruning, which PostgreSQL defers while an older snapshot sees the old ones (a report, a
replica's feedback) or another backend holds the page. The table is about a fifth larger for
the intents' lifetime. Pages written before keep their fill.
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
