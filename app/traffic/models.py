from sqlalchemy import Float, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db


class RateBucket(db.Model):
    """Token bucket state for the embedded setup (Redis holds it when REDIS_URL is set)."""

    __tablename__ = "rate_buckets"

    bucket: Mapped[str] = mapped_column(String(64), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
