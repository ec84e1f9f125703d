"""Webhook endpoints, the events outbox and the delivery attempts (CONTRACT.md, Webhooks).

Every table leads its keys with tenant_id, so it distributes by tenant beside the rest
(deploy/README: Citus). Ids are strings that sort by creation time (app.webhooks.ids), so a
listing pages with `before=<id>` and a receiver's webhook-id is the event's id."""
from sqlalchemy import (BigInteger, Boolean, ForeignKey, ForeignKeyConstraint, Index, Integer,
                        String, Text, UniqueConstraint, text)
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db


class WebhookEndpoint(db.Model):
    """Where a tenant receives events. The secret is sealed (app.crypto), shown once; during a
    rotation's grace the previous one signs too."""

    __tablename__ = "webhook_endpoints"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "we_" + 24 hex
    url: Mapped[str] = mapped_column(String(2048))
    # Event types it receives, space-separated ("audit.*" for every audit event).
    events: Mapped[str] = mapped_column(String(1000))
    secret_sealed: Mapped[str] = mapped_column(Text)
    previous_secret_sealed: Mapped[str | None] = mapped_column(Text)
    previous_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)


class WebhookEvent(db.Model):
    """The outbox: one row per event, written in the transaction that raised it. The delivery
    worker fans it out to the tenant's endpoints (dispatched_at set in that same step).
    `dedupe_key` makes an event that must happen once (a threshold a month, a key's expiry
    notice) impossible to raise twice."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        UniqueConstraint("tenant_id", "dedupe_key", name="uq_webhook_events_tenant_dedupe"),
        Index("ix_webhook_events_undispatched", "dispatched_at", "created_at"),
    )

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[str] = mapped_column(String(48), primary_key=True)  # the webhook-id
    type: Mapped[str] = mapped_column(String(64))
    data: Mapped[str] = mapped_column(Text)  # JSON object; never a secret
    created_at: Mapped[int] = mapped_column(BigInteger)
    # A test event goes to one endpoint; NULL: every endpoint subscribed to the type.
    endpoint_id: Mapped[str | None] = mapped_column(String(32))
    dedupe_key: Mapped[str | None] = mapped_column(String(120))
    dispatched_at: Mapped[int | None] = mapped_column(BigInteger)


class WebhookDelivery(db.Model):
    """One attempt to deliver an event to an endpoint: scheduled (`at` NULL), then made. A
    worker claims a due attempt by leasing it (`leased_until`), so each is made by one worker;
    a worker that dies mid-attempt leaves the lease to run out, and the attempt is made again."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "endpoint_id"],
                             ["webhook_endpoints.tenant_id", "webhook_endpoints.id"],
                             name="fk_webhook_deliveries_endpoint", ondelete="CASCADE"),
        Index("ix_webhook_deliveries_due", "at", "scheduled_at"),
        Index("ix_webhook_deliveries_endpoint", "tenant_id", "endpoint_id", "id"),
        # The attempts not yet made, by endpoint: a claim's check for one in flight reads
        # these, not the endpoint's history (migration c8e0a2b4d617).
        Index("ix_webhook_deliveries_not_made", "tenant_id", "endpoint_id",
              postgresql_where=text("at IS NULL"), sqlite_where=text("at IS NULL")),
    )

    tenant_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    id: Mapped[str] = mapped_column(String(48), primary_key=True)  # "whd_" + time-ordered hex
    endpoint_id: Mapped[str] = mapped_column(String(32))
    event_id: Mapped[str] = mapped_column(String(48))
    attempt: Mapped[int] = mapped_column(Integer)  # 1 for the first
    scheduled_at: Mapped[int] = mapped_column(BigInteger)
    leased_until: Mapped[int | None] = mapped_column(BigInteger)
    lease_token: Mapped[str | None] = mapped_column(String(32))
    at: Mapped[int | None] = mapped_column(BigInteger)  # when it was made
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(200))
    delivered: Mapped[bool] = mapped_column(Boolean, default=False)
    next_attempt_at: Mapped[int | None] = mapped_column(BigInteger)


class UsageAlert(db.Model):
    """A percentage of the plan at which the tenant hears `usage.threshold` (default 80 and
    100, written with the tenant). The gate's statement reads these rows only by the tenant's
    key, in the statement that counts the verification."""

    __tablename__ = "usage_alerts"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    threshold: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
