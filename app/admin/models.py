from sqlalchemy import Boolean, DateTime, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.extensions import db


class AdminKey(db.Model):
    """A key for internal services: same header and format as tenant keys, stored hashed."""

    __tablename__ = "admin_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    key_digest: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(16))
    # Admin keys may verify responses too, so they carry a response signing secret.
    signing_secret_sealed: Mapped[str] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at = mapped_column(DateTime, default=utcnow, nullable=False)
    revoked_at = mapped_column(DateTime)
