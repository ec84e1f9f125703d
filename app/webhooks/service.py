"""A tenant's webhook endpoints and usage alerts, shared by the tenant API, the admin API and
the CLI; the caller owns the transaction (CONTRACT.md, Webhooks)."""
import logging
import secrets as random

from flask import current_app
from sqlalchemy import and_, func, select

from app import crypto
from app.clock import now_seconds
from app.errors import Conflict, NotFound
from app.extensions import db
from app.sql import delete_batch
from app.tenants import audit
from app.tenants.tenant_row import existing_tenant, locked_tenant
from app.webhooks import events, signatures, ssrf
from app.webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent

log = logging.getLogger(__name__)

MAX_ENDPOINTS = 5
TOO_MANY = f"a tenant holds at most {MAX_ENDPOINTS} webhook endpoints: delete one first"
NOT_FOUND = "webhook not found"


def create_endpoint(tenant_id, url, events_=None):
    """A new endpoint; returns (row, secret). The secret exists in plain text only here."""
    ssrf.check_url(url, current_app.config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"])
    locked_tenant(tenant_id)
    count = db.session.execute(select(func.count()).select_from(WebhookEndpoint)
                               .where(WebhookEndpoint.tenant_id == tenant_id)).scalar_one()
    if count >= MAX_ENDPOINTS:
        raise Conflict(TOO_MANY)
    secret = signatures.new_secret()
    subscribed = list(dict.fromkeys(events_)) if events_ else list(events.SUBSCRIBABLE)
    row = WebhookEndpoint(tenant_id=tenant_id, id="we_" + random.token_hex(12), url=url,
                          events=" ".join(subscribed), secret_sealed=crypto.seal(secret),
                          created_at=now_seconds())
    db.session.add(row)
    db.session.flush()
    # Not the URL: some receivers carry a token in it.
    audit.record(tenant_id, "webhook.created", webhook_id=row.id, events=subscribed)
    log.info("webhook created", extra={"tenant_id": tenant_id, "webhook_id": row.id})
    return row, secret


def list_endpoints(tenant_id):
    existing_tenant(tenant_id)
    return db.session.execute(
        select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id)
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)).scalars().all()


def _endpoint(tenant_id, endpoint_id):
    row = db.session.execute(
        select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id,
                                      WebhookEndpoint.id == endpoint_id)).scalar_one_or_none()
    if row is None:
        raise NotFound(NOT_FOUND)
    return row


def delete_endpoint(tenant_id, endpoint_id):
    """Delete the endpoint with its delivery history; nothing more is sent to it."""
    locked_tenant(tenant_id)
    row = _endpoint(tenant_id, endpoint_id)
    db.session.delete(row)
    db.session.flush()
    audit.record(tenant_id, "webhook.deleted", webhook_id=row.id)
    log.info("webhook deleted", extra={"tenant_id": tenant_id, "webhook_id": row.id})
    return row


def rotate_secret(tenant_id, endpoint_id, grace_seconds=0):
    """A new secret; for `grace_seconds` the previous one signs each attempt too. Returns
    (secret, until when the previous one signs or None)."""
    locked_tenant(tenant_id)
    row = _endpoint(tenant_id, endpoint_id)
    secret = signatures.new_secret()
    grace_seconds = crypto.grace_for(row.secret_sealed, grace_seconds, tenant_id=tenant_id,
                                     webhook_id=row.id)
    if grace_seconds > 0:
        row.previous_secret_sealed = row.secret_sealed
        row.previous_secret_expires_at = now_seconds() + grace_seconds
    else:
        row.previous_secret_sealed = row.previous_secret_expires_at = None
    row.secret_sealed = crypto.seal(secret)
    db.session.flush()
    audit.record(tenant_id, "webhook.secret_rotated", webhook_id=row.id,
                 grace_seconds=grace_seconds)
    return secret, row.previous_secret_expires_at


def secrets_in_force(row, now):
    """The secrets that sign an attempt now: the current one, and the previous one in grace."""
    found = [crypto.unseal(row.secret_sealed)]
    if row.previous_secret_sealed and (row.previous_secret_expires_at or 0) >= now:
        found.append(crypto.unseal(row.previous_secret_sealed))
    return found


def send_test(tenant_id, endpoint_id):
    """Queue a webhook.test event for this endpoint alone."""
    existing_tenant(tenant_id)  # an unknown tenant (admin path) is named as such, as elsewhere
    row = _endpoint(tenant_id, endpoint_id)
    event_id = events.raise_event(tenant_id, events.TEST, {"webhook_id": row.id},
                                  now_seconds(), endpoint_id=row.id, only_if_subscribed=False)
    return {"event_id": event_id, "type": events.TEST}


def deliveries(tenant_id, endpoint_id, limit=50, before=None):
    """The endpoint's attempts, made and scheduled, newest first; `before`: the last id of the
    previous page."""
    existing_tenant(tenant_id)
    _endpoint(tenant_id, endpoint_id)
    query = (select(WebhookDelivery, WebhookEvent.type)
             .join(WebhookEvent, and_(WebhookEvent.tenant_id == WebhookDelivery.tenant_id,
                                      WebhookEvent.id == WebhookDelivery.event_id))
             .where(WebhookDelivery.tenant_id == tenant_id,
                    WebhookDelivery.endpoint_id == endpoint_id))
    if before is not None:
        query = query.where(WebhookDelivery.id < before)
    rows = db.session.execute(query.order_by(WebhookDelivery.id.desc()).limit(limit)).all()
    return [_delivery(row, event_type) for row, event_type in rows]


def _delivery(row, event_type):
    if row.delivered:
        state = "delivered"
    elif row.at is None:
        state = "pending"
    else:
        state = "retried" if row.next_attempt_at is not None else "failed"
    return {"id": row.id, "event_id": row.event_id, "type": event_type, "attempt": row.attempt,
            "at": row.at, "status_code": row.status_code, "error": row.error,
            "next_attempt_at": row.scheduled_at if row.at is None else row.next_attempt_at,
            "delivered": bool(row.delivered), "state": state}


def usage_alerts(tenant_id):
    existing_tenant(tenant_id)
    return {"thresholds": events.thresholds(tenant_id)}


def set_usage_alerts(tenant_id, thresholds):
    locked_tenant(tenant_id)
    old = events.thresholds(tenant_id)
    events.set_thresholds(tenant_id, thresholds)
    new = events.thresholds(tenant_id)
    if new != old:
        audit.record(tenant_id, "usage_alerts.changed", old=old, new=new)
    return {"thresholds": new}


RETENTION = 30 * 86400  # deliveries are kept 30 days (CONTRACT.md, Webhooks)


def purge_deliveries(cutoff, batch_size):
    """Delete up to `batch_size` attempts made before `cutoff`, then up to `batch_size`
    dispatched events older than it that no attempt refers to any more; return (attempts,
    events) deleted, (0, 0) when none is left."""
    attempts = delete_batch((WebhookDelivery.tenant_id, WebhookDelivery.id),
                            WebhookDelivery.at < cutoff, limit=batch_size)
    referred = select(WebhookDelivery.event_id).where(
        WebhookDelivery.tenant_id == WebhookEvent.tenant_id,
        WebhookDelivery.event_id == WebhookEvent.id)
    old_events = delete_batch((WebhookEvent.tenant_id, WebhookEvent.id),
                              WebhookEvent.created_at < cutoff,
                              WebhookEvent.dispatched_at.is_not(None), ~referred.exists(),
                              limit=batch_size)
    return attempts, old_events


def delivery_stats(now):
    """For /metrics: attempts kept (30 days) by outcome, and the age in seconds of the oldest
    attempt that is due and not yet made (0 when none is). An event no worker has fanned out
    yet is such an attempt too, due since it was raised: with no worker running at all there
    are no attempt rows, and that is the outage the age must show."""
    made = db.session.execute(
        select(WebhookDelivery.delivered, WebhookDelivery.next_attempt_at.is_(None), func.count())
        .where(WebhookDelivery.at.is_not(None))
        .group_by(WebhookDelivery.delivered, WebhookDelivery.next_attempt_at.is_(None))).all()
    outcomes = {"delivered": 0, "retried": 0, "failed": 0}
    for delivered, last, count in made:
        outcomes["delivered" if delivered else "failed" if last else "retried"] += count
    oldest_attempt = db.session.execute(
        select(func.min(WebhookDelivery.scheduled_at))
        .where(WebhookDelivery.at.is_(None), WebhookDelivery.scheduled_at <= now)).scalar()
    oldest_event = db.session.execute(
        select(func.min(WebhookEvent.created_at))
        .where(WebhookEvent.dispatched_at.is_(None))).scalar()
    due = [since for since in (oldest_attempt, oldest_event) if since is not None]
    return outcomes, max(0, now - min(due)) if due else 0
