"""The tenant row that a per-tenant operation starts from: 404 when there is none."""
from sqlalchemy import select

from app.errors import NotFound
from app.extensions import db
from app.tenants.models import Tenant


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
    return tenant


def existing_tenant(tenant_id):
    """The tenant row, for reads of what belongs to it."""
    tenant = db.session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant
