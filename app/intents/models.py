from sqlalchemy import BigInteger, Boolean, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

# BIGINT on PostgreSQL, INTEGER on SQLite (only INTEGER PRIMARY KEY autoincrements there).
BigId = BigInteger().with_variant(Integer, "sqlite")


class Intent(db.Model):
    """An issued intent signature. Holds no personal data: the user token is never stored."""

    __tablename__ = "intents"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    intent_hash: Mapped[str] = mapped_column(String(71), unique=True)
    # "tenant:<id>" or "admin:<id>": who may verify it, and whose usage it counts against.
    owner: Mapped[str] = mapped_column(String(40))
    intent_class: Mapped[str] = mapped_column(String(16))
    issued_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)
    consumed_at: Mapped[int | None] = mapped_column(BigInteger)


class SeenResponse(db.Model):
    """A match_id an owner has already had verified: the unique key is the replay check."""

    __tablename__ = "seen_responses"

    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    match_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    intent_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("intents.id", ondelete="CASCADE"), index=True
    )


class IdempotencyRecord(db.Model):
    """A verify verdict kept for retries: a digest of the body, never the payload itself."""

    __tablename__ = "idempotency_records"

    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    body_digest: Mapped[str] = mapped_column(String(64))
    cleared: Mapped[bool | None] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[int] = mapped_column(BigInteger, index=True)
