"""The tenant row that a per-tenant operation starts from: 404 when there is none."""
from flask import g, has_request_context
from sqlalchemy import or_, select

from app.clock import now_seconds
from app.errors import NotFound, Unauthorized
from app.extensions import db
from app.tenants.models import ApiKey, Tenant

INACTIVE_KEY = "Invalid or inactive API key"


def active_keys(now):
    """The conditions under which an API key still authenticates at `now`."""
    return (ApiKey.revoked_at.is_(None), or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now))


def locked_tenant(tenant_id):
    """The tenant row, locked until the transaction ends: changes that count a tenant's keys or
    number its audit entries run one at a time (SQLite's BEGIN IMMEDIATE serializes writers
    anyway). 404 when there is no such tenant. The row is read afresh under the lock: a tenant
    the session read before (find_tenant) would otherwise keep what it held then, and a change
    judged on it would miss a concurrent one (two plan.changed for one change)."""
    tenant = db.session.execute(
        select(Tenant).where(Tenant.id == tenant_id).with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if tenant is None:
        raise NotFound("tenant not found")
    _confirm_caller(tenant)
    return tenant


def _confirm_caller(tenant):
    """A change made with one of the tenant's own keys, once the tenant's row is locked: that
    key must still authenticate. Its revocation (a rotation, the tenant's deactivation) takes
    this same lock, so one that has answered is seen here. Authentication read the key before
    the lock: without this, a request in flight with a key being revoked went on to mint a key
    or a signing secret after the revocation's answer."""
    principal = g.get("principal") if has_request_context() else None
    if principal is None or principal.kind != "tenant" or principal.id != tenant.id:
        return  # an operator (admin key, CLI) acting on the tenant
    # Once per transaction: the lock is held from here to its end, and the change may revoke
    # the calling key itself (rotate-key) before it locks the row again (its audit entry).
    session = db.session()  # the request's own, behind the scoped proxy
    transaction = session.get_transaction()
    if session.info.get("caller_confirmed_in") is transaction:
        return
    still_active = session.execute(
        select(ApiKey.id).where(ApiKey.id == principal.account.api_key_id,
                                ApiKey.tenant_id == tenant.id, *active_keys(now_seconds()))
    ).first()
    if still_active is None or not tenant.active:
        raise Unauthorized(INACTIVE_KEY)
    session.info["caller_confirmed_in"] = transaction


def existing_tenant(tenant_id):
    """The tenant row, for reads of what belongs to it."""
    tenant = db.session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant
