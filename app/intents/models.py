from sqlalchemy import (BigInteger, Boolean, FetchedValue, Integer, String,
                        UniqueConstraint)
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

# BIGINT on PostgreSQL, INTEGER on SQLite (only INTEGER PRIMARY KEY autoincrements there).
BigId = BigInteger().with_variant(Integer, "sqlite")


class Intent(db.Model):
    """An issued intent signature. Holds no personal data: the user token is never stored.

    Keys lead with `owner`, the column the table is distributed by (deploy/README: Citus):
    every key and unique constraint of a per-tenant table holds it.

    The gate's one write to an intent (consumed_at and match_id) changes no indexed column, and
    a page is filled to 65 % when intents are issued: the room left holds every intent of the
    page in its consumed form, some 48 bytes larger (migration b5d7f9a1c348), so PostgreSQL
    keeps each consumed version on its page with no new index entry (a HOT update). Three
    indexes only: the key, the lookup by hash and the purge's by expiry (c2e4a6f8b135)."""

    __tablename__ = "intents"
    __table_args__ = (
        UniqueConstraint("owner", "intent_hash"),
        {"postgresql_with": {"fillfactor": 65}},
    )

    # "tenant:<id>" or "admin:<id>": who may verify it, and whose usage it counts against.
    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    # PostgreSQL numbers intents from the sequence the table has always had; SQLite, which
    # numbers only a lone INTEGER PRIMARY KEY, gets the next id in the INSERT itself.
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False,
                                    server_default=FetchedValue())
    intent_hash: Mapped[str] = mapped_column(String(71))
    intent_class: Mapped[str] = mapped_column(String(16))
    issued_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)
    consumed_at: Mapped[int | None] = mapped_column(BigInteger)
    # The match_id its verify recorded in seen_responses (when every check before the replay
    # check passed): the purge finds the intent's seen_responses row by its key with it.
    match_id: Mapped[str | None] = mapped_column(String(256))


class SeenResponse(db.Model):
    """A match_id an owner has already had verified: the unique key is the replay check.

    intent_id names the intent whose verify recorded it, with no foreign key: the gate inserts
    only the id its own UPDATE returned, and the purge deletes these rows with their intents
    (the key's check cost a quarter of the gate's PostgreSQL time; migration b3d5f7a9c024). It
    has no index either: the purge finds a row by its key, from the intent's match_id, and
    deletes it only when intent_id is that intent's (a replayed match_id on another intent
    leaves the first intent's row alone)."""

    __tablename__ = "seen_responses"

    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    match_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    intent_id: Mapped[int] = mapped_column(BigId)


class IdempotencyRecord(db.Model):
    """A verify verdict kept for retries: a digest of the body, never the payload itself."""

    __tablename__ = "idempotency_records"

    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    body_digest: Mapped[str] = mapped_column(String(64))
    cleared: Mapped[bool | None] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[int] = mapped_column(BigInteger, index=True)
