"""every key of intents holds its owner (ready to distribute by tenant)

Revision ID: f7a1c3e5b920
Revises: e5f9a3b72c48
Create Date: 2026-11-23 10:00:00

intents was keyed by `id` alone and unique on `intent_hash` alone; a table distributed by
`owner` (Citus, deploy/README.md) needs the owner in every primary key and unique constraint,
and seen_responses' foreign key must carry it too. Without downtime on PostgreSQL: the new
unique indexes are built CONCURRENTLY (no write lock while they build, outside any
transaction), then one short transaction swaps the constraints onto them (a catalogue change,
under a lock_timeout so it never queues traffic behind a long transaction: if it times out,
run the upgrade again; a failed concurrent build leaves an invalid index that is rebuilt).
The new foreign key is added NOT VALID and validated afterwards, which does not block writes.
SQLite copies the tables (batch mode; env.py keeps foreign keys off meanwhile).

The gate's statements are unchanged (they already look intents up by owner and hash), so the
PL/pgSQL functions of e5f9a3b72c48 stay as they are.
"""
import sqlalchemy as sa
from alembic import op


revision = 'f7a1c3e5b920'
down_revision = 'e5f9a3b72c48'
branch_labels = None
depends_on = None

NEW_INDEXES = (
    ("pk_intents_owner_id", "CREATE UNIQUE INDEX CONCURRENTLY pk_intents_owner_id "
                            "ON intents (owner, id)"),
    ("uq_intents_owner", "CREATE UNIQUE INDEX CONCURRENTLY uq_intents_owner "
                         "ON intents (owner, intent_hash)"),
    ("ix_intents_id", "CREATE INDEX CONCURRENTLY ix_intents_id ON intents (id)"),
)


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgresql()
    else:
        _upgrade_sqlite()


def _upgrade_postgresql():
    with op.get_context().autocommit_block():
        for name, create in NEW_INDEXES:
            _build_concurrently(name, create)
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE seen_responses DROP CONSTRAINT fk_seen_responses_intent_id_intents")
    op.execute("ALTER TABLE intents DROP CONSTRAINT uq_intents_intent_hash")
    op.execute("ALTER TABLE intents DROP CONSTRAINT pk_intents")
    op.execute("ALTER TABLE intents ADD CONSTRAINT pk_intents PRIMARY KEY "
               "USING INDEX pk_intents_owner_id")
    op.execute("ALTER TABLE intents ADD CONSTRAINT uq_intents_owner UNIQUE "
               "USING INDEX uq_intents_owner")
    op.execute("ALTER TABLE seen_responses ADD CONSTRAINT fk_seen_responses_owner_intents "
               "FOREIGN KEY (owner, intent_id) REFERENCES intents (owner, id) "
               "ON DELETE CASCADE NOT VALID")
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE seen_responses VALIDATE CONSTRAINT "
                   "fk_seen_responses_owner_intents")


def _build_concurrently(name, create):
    """Build an index without blocking writes; rebuild one a failed earlier run left invalid."""
    valid = op.get_bind().exec_driver_sql(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = %(name)s", {"name": name}).scalar()
    if valid:
        return
    if valid is not None:
        op.execute(f"DROP INDEX CONCURRENTLY {name}")
    op.execute(create)


def _upgrade_sqlite():
    _copy_intents(sa.PrimaryKeyConstraint("owner", "id", name="pk_intents"),
                  sa.UniqueConstraint("owner", "intent_hash", name="uq_intents_owner"))
    op.create_index("ix_intents_id", "intents", ["id"])
    with op.batch_alter_table("seen_responses", recreate="always") as batch_op:
        batch_op.drop_constraint("fk_seen_responses_intent_id_intents", type_="foreignkey")
        batch_op.create_foreign_key("fk_seen_responses_owner_intents", "intents",
                                    ["owner", "intent_id"], ["owner", "id"], ondelete="CASCADE")


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE seen_responses DROP CONSTRAINT fk_seen_responses_owner_intents")
        op.execute("ALTER TABLE intents DROP CONSTRAINT uq_intents_owner")
        op.execute("ALTER TABLE intents DROP CONSTRAINT pk_intents")
        op.execute("DROP INDEX ix_intents_id")
        op.execute("ALTER TABLE intents ADD CONSTRAINT pk_intents PRIMARY KEY (id)")
        op.execute("ALTER TABLE intents ADD CONSTRAINT uq_intents_intent_hash "
                   "UNIQUE (intent_hash)")
        op.execute("ALTER TABLE seen_responses ADD CONSTRAINT "
                   "fk_seen_responses_intent_id_intents FOREIGN KEY (intent_id) "
                   "REFERENCES intents (id) ON DELETE CASCADE")
        return
    with op.batch_alter_table("seen_responses", recreate="always") as batch_op:
        batch_op.drop_constraint("fk_seen_responses_owner_intents", type_="foreignkey")
        batch_op.create_foreign_key("fk_seen_responses_intent_id_intents", "intents",
                                    ["intent_id"], ["id"], ondelete="CASCADE")
    op.drop_index("ix_intents_id", "intents")
    _copy_intents(sa.PrimaryKeyConstraint("id", name="pk_intents"),
                  sa.UniqueConstraint("intent_hash", name="uq_intents_intent_hash"))


def _copy_intents(*keys):
    """SQLite changes a primary key by copying the table (the same as batch mode, written out:
    batch mode's reflection keeps the old key on the copy)."""
    op.create_table(
        "_intents_copy",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("intent_hash", sa.String(length=71), nullable=False),
        sa.Column("owner", sa.String(length=40), nullable=False),
        sa.Column("intent_class", sa.String(length=16), nullable=False),
        sa.Column("issued_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("consumed_at", sa.BigInteger(), nullable=True),
        *keys,
    )
    columns = "id, intent_hash, owner, intent_class, issued_at, expires_at, consumed_at"
    op.execute(f"INSERT INTO _intents_copy ({columns}) SELECT {columns} FROM intents")
    op.drop_table("intents")
    op.rename_table("_intents_copy", "intents")
    op.create_index("ix_intents_expires_at", "intents", ["expires_at"])
