"""The audit log: who changed a tenant's keys, signing secret or keys, scheme, plan or active
flag, written by the service that makes the change, in the same transaction. Never a secret.
Each entry is also an `audit.<action>` webhook event, raised in that same transaction."""
import json

from flask import g, has_request_context
from sqlalchemy import func, select

from app.clock import now_seconds
from app.extensions import db
from app.tenants.tenant_row import existing_tenant, locked_tenant
from app.tenants.models import AuditEntry
from app.traffic.addresses import client_address
from app.webhooks import events


def record(tenant_id, action, **details):
    """Add an entry to the caller's transaction. Entries are numbered per tenant under the
    tenant row's lock, so concurrent changes of one tenant queue here and never collide.
    `action` is one of events.AUDIT_ACTIONS, the list webhook subscriptions are checked
    against: an action missing there could never be subscribed to."""
    if action not in events.AUDIT_ACTIONS:
        raise ValueError(f"audit action {action!r} is not in events.AUDIT_ACTIONS")
    locked_tenant(tenant_id)
    next_id = db.session.execute(
        select(func.coalesce(func.max(AuditEntry.id), 0) + 1)
        .where(AuditEntry.tenant_id == tenant_id)
    ).scalar_one()
    in_request = has_request_context()
    entry = AuditEntry(
        tenant_id=tenant_id, id=next_id, at=now_seconds(), action=action, actor=_actor(),
        request_id=g.get("request_id") if in_request else None,
        address=client_address() if in_request else None,
        details=json.dumps(details, sort_keys=True) if details else None,
    )
    db.session.add(entry)
    db.session.flush()
    events.raise_event(tenant_id, events.AUDIT_PREFIX + action, _listed(entry), entry.at)


def _actor():
    """The key prefix of a tenant key, the name of an admin key, or `cli`."""
    if not has_request_context():
        return "cli"
    principal = g.get("principal")
    if principal is None:
        return "unknown"
    if principal.kind == "admin":
        return f"admin:{principal.account.name}"
    return f"key:{principal.account.prefix}"


def entries(tenant_id, limit=50, before=None):
    """Newest first; `before` is the id of the last entry of the previous page."""
    existing_tenant(tenant_id)
    query = select(AuditEntry).where(AuditEntry.tenant_id == tenant_id)
    if before is not None:
        query = query.where(AuditEntry.id < before)
    rows = db.session.execute(query.order_by(AuditEntry.id.desc()).limit(limit)).scalars().all()
    return [_listed(row) for row in rows]


def _listed(row):
    """An entry as the listing and its webhook event show it."""
    return {"id": row.id, "at": row.at, "action": row.action, "actor": row.actor,
            "request_id": row.request_id, "address": row.address,
            "details": json.loads(row.details) if row.details else {}}
