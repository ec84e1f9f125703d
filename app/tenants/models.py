import base64
import hashlib

from sqlalchemy import (BigInteger, Boolean, Column, DateTime, ForeignKey, Integer, SmallInteger,
                        String, Text)
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.extensions import db


class Tenant(db.Model):
    __tablename__ = "tenants"
    # credentials_version: on PostgreSQL a trigger moves it on at every UPDATE of the row,
    # whoever writes it (a service function, `secrets reseal`, an operator's SQL), and a kept
    # principal's fingerprint names it (app.tenants.keys). Only the database's functions read
    # it: the ORM neither reads nor writes it, so a release that has it still runs on a
    # database that does not (a rollback: deploy/README).
    __table_args__ = (Column("credentials_version", BigInteger, nullable=False),)
    __mapper_args__ = {"exclude_properties": ["credentials_version"]}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    plan: Mapped[str] = mapped_column(String(16), default="free")
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    signing_secret_sealed: Mapped[str] = mapped_column(Text)
    previous_signing_secret_sealed: Mapped[str | None] = mapped_column(Text)
    previous_signing_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    signature_scheme: Mapped[str] = mapped_column(String(16), default="bound")
    # After a scheme switch with a grace period, the scheme before it still verifies until then.
    previous_signature_scheme: Mapped[str | None] = mapped_column(String(16))
    previous_scheme_valid_until: Mapped[int | None] = mapped_column(BigInteger)
    created_at = mapped_column(DateTime, default=utcnow, nullable=False)
    key_rotated_at = mapped_column(DateTime)


class ApiKey(db.Model):
    """A tenant's API key: several may be active at once, so a tenant rolls keys without
    downtime. Only the SHA-256 digest is kept; the prefix lets people tell keys apart.

    Looked up by digest before the tenant is known, so under Citus it is a reference table
    (like tenants and admin_keys), not one distributed by tenant."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "ak_" + 24 hex
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(100))
    key_digest: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    # What the key may do (app.tenants.scopes): space-separated, in canonical order.
    scopes: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)


class AuditEntry(db.Model):
    """A change to a tenant's keys, secrets, scheme, plan or active flag, written in the same
    transaction as the change. Never a secret: key ids and prefixes at most."""

    __tablename__ = "audit_log"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    # Numbered per tenant (1, 2, ...) under the tenant row's lock: the cursor of the listing.
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    at: Mapped[int] = mapped_column(BigInteger)
    action: Mapped[str] = mapped_column(String(40))
    actor: Mapped[str] = mapped_column(String(120))
    request_id: Mapped[str | None] = mapped_column(String(128))
    address: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[str | None] = mapped_column(Text)  # JSON: ids, prefixes, old and new plan


class DailyUsage(db.Model):
    """Verifications per tenant and UTC day by outcome, counted in the gate's own transaction:
    a month's usage_count is the sum of its days. A day is the sum of its shards
    (app.tenants.metering.SHARDS); day 00 of a month ('YYYY-MM-00') holds what it counted
    before days were counted, which no listing of days shows (migration f1a3c5e7b924)."""

    __tablename__ = "daily_usage"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD, UTC
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, default=0,
                                       server_default="0")
    verifications: Mapped[int] = mapped_column(BigInteger, default=0)
    cleared: Mapped[int] = mapped_column(BigInteger, default=0)
    unknown_intent: Mapped[int] = mapped_column(BigInteger, default=0)
    expired_intent: Mapped[int] = mapped_column(BigInteger, default=0)
    replayed_intent: Mapped[int] = mapped_column(BigInteger, default=0)
    invalid_signature: Mapped[int] = mapped_column(BigInteger, default=0)
    timestamp_out_of_window: Mapped[int] = mapped_column(BigInteger, default=0)
    replayed_response: Mapped[int] = mapped_column(BigInteger, default=0)


class SigningKey(db.Model):
    """An Ed25519 public key with which a tenant's AI service signs responses. Only the public
    half is ever known here: nothing stored can forge a signature."""

    __tablename__ = "signing_keys"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "sk_" + 24 hex
    name: Mapped[str | None] = mapped_column(String(100))
    public_key: Mapped[str] = mapped_column(String(44))  # base64 of the 32 raw bytes
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)

    @property
    def fingerprint(self):
        """In OpenSSH's form (`SHA256:`, unpadded base64), over the 32 raw bytes as CONTRACT.md
        says. Not the value `ssh-keygen -l` shows: it hashes the key's SSH wire form (its type
        name, then the bytes)."""
        digest = hashlib.sha256(base64.b64decode(self.public_key)).digest()
        return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class MonthlyUsage(db.Model):
    """Verifications counted against a limited plan per tenant and calendar month (UTC): the
    sum of its shards (app.tenants.metering.SHARDS). A limited plan counts on shard 0; the
    other shards hold what the month counted before a move to a limited plan (and, before
    migration f1a3c5e7b924, every plan's counts). The month's usage_count is its days'."""

    __tablename__ = "monthly_usage"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    period: Mapped[str] = mapped_column(String(7), primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True, default=0,
                                       server_default="0")
    usage_count: Mapped[int] = mapped_column(BigInteger, default=0)
