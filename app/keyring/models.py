from sqlalchemy import BigInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db


class SecretKeyCheck(db.Model):
    """One row per encryption key that sealed secrets in this database: the key's check value
    (app.keyring.ring.check_value), never the key. A process whose ring lacks one of these
    keys would fail to unseal some secret, so it refuses to start."""

    __tablename__ = "secret_key_checks"

    check_value: Mapped[str] = mapped_column(String(64), primary_key=True)
    recorded_at: Mapped[int] = mapped_column(BigInteger)
