"""seen_responses without its foreign key to intents (a quarter of the gate's PostgreSQL time)

Revision ID: b3d5f7a9c024
Revises: a2c4e6f8b013
Create Date: 2026-11-23 17:40:00

Every cleared verify inserts a seen_responses row, and PostgreSQL checked the foreign key with a
query of its own (an after-row trigger locking the intent FOR KEY SHARE): measured on the gate's
function, 0.32 ms of PostgreSQL CPU per call with the key, 0.24 ms without. The key guarded
nothing the gate does not already guarantee: the only writer of seen_responses is the gate, which
inserts the id its own UPDATE of the intent returned, in the same statement (PostgreSQL) or
transaction (SQLite); and the purge deletes an intent's seen_responses with the intent, in one
transaction. The index on intent_id stays: the purge finds the rows by it.

Dropping a constraint takes an ACCESS EXCLUSIVE lock on both tables for a moment, under a
lock_timeout so it never queues traffic behind a long transaction (if it times out, run the
upgrade again). The downgrade adds the key back NOT VALID, then validates it without blocking
writes.
"""
from alembic import op

revision = 'b3d5f7a9c024'
down_revision = 'a2c4e6f8b013'
branch_labels = None
depends_on = None

FOREIGN_KEY = "fk_seen_responses_owner_intents"


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SET LOCAL lock_timeout = '5s'")
        op.execute(f"ALTER TABLE seen_responses DROP CONSTRAINT IF EXISTS {FOREIGN_KEY}")
        return
    with op.batch_alter_table("seen_responses", recreate="always") as batch_op:
        batch_op.drop_constraint(FOREIGN_KEY, type_="foreignkey")


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("SET LOCAL lock_timeout = '5s'")
        op.execute(f"ALTER TABLE seen_responses ADD CONSTRAINT {FOREIGN_KEY} "
                   "FOREIGN KEY (owner, intent_id) REFERENCES intents (owner, id) "
                   "ON DELETE CASCADE NOT VALID")
        with op.get_context().autocommit_block():
            op.execute(f"ALTER TABLE seen_responses VALIDATE CONSTRAINT {FOREIGN_KEY}")
        return
    with op.batch_alter_table("seen_responses", recreate="always") as batch_op:
        batch_op.create_foreign_key(FOREIGN_KEY, "intents", ["owner", "intent_id"],
                                    ["owner", "id"], ondelete="CASCADE")
