from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.extensions import db


class Tenant(db.Model):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    plan: Mapped[str] = mapped_column(String(16), default="free")
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    # Only the SHA-256 digest of the key is kept; the prefix lets people tell keys apart.
    api_key_digest: Mapped[str] = mapped_column(String(64), unique=True)
    api_key_prefix: Mapped[str] = mapped_column(String(16))
    signing_secret_sealed: Mapped[str] = mapped_column(Text)
    previous_signing_secret_sealed: Mapped[str | None] = mapped_column(Text)
    previous_signing_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    signature_scheme: Mapped[str] = mapped_column(String(16), default="bound")
    created_at = mapped_column(DateTime, default=utcnow, nullable=False)
    key_rotated_at = mapped_column(DateTime)


class MonthlyUsage(db.Model):
    """Verifications counted per tenant and calendar month (UTC), one row per pair."""

    __tablename__ = "monthly_usage"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    period: Mapped[str] = mapped_column(String(7), primary_key=True)
    usage_count: Mapped[int] = mapped_column(BigInteger, default=0)
