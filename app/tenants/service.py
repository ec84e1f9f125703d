"""Tenant operations, shared by the HTTP API and the flask CLI. Each function is one transaction."""
import logging
from dataclasses import dataclass

from sqlalchemy import select, update

from app import crypto
from app.clock import billing_period, now_seconds, utcnow
from app.errors import NotFound, Unauthorized
from app.extensions import db
from app.sql import add_unique
from app.tenants import mail
from app.tenants.models import MonthlyUsage, Tenant
from app.tenants.plans import PAID_PLANS, monthly_limit

log = logging.getLogger(__name__)


@dataclass
class Provisioned:
    """A new tenant with the plaintext key and secret: the only time they exist unhashed."""

    tenant: Tenant
    api_key: str
    signing_secret: str
    email_sent: bool | None = None
    email_error: str | None = None


def create_tenant(email, plan, send_email=False):
    api_key = crypto.new_api_key()
    signing_secret = crypto.new_signing_secret()
    tenant = Tenant(
        email=email.lower(),
        plan=plan,
        active=True,
        api_key_digest=crypto.key_digest(api_key),
        api_key_prefix=crypto.display_prefix(api_key),
        signing_secret_sealed=crypto.seal(signing_secret),
        signature_scheme="bound",
    )
    add_unique(tenant, "a tenant with this email already exists")
    log.info("tenant created", extra={"tenant_id": tenant.id, "plan": plan})
    provisioned = Provisioned(tenant, api_key, signing_secret)
    if send_email and plan in PAID_PLANS:
        # The tenant exists whatever happens here: a failed delivery is reported, and the key
        # can then only be re-issued by rotation (it is not stored in a readable form).
        provisioned.email_sent, provisioned.email_error = mail.send_api_key(
            tenant.email, plan, api_key, signing_secret
        )
    return provisioned


def find_tenant(reference):
    """Look a tenant up by numeric id or by email."""
    reference = str(reference).strip()
    if reference.isdigit():
        tenant = db.session.get(Tenant, int(reference))
    else:
        tenant = db.session.execute(
            select(Tenant).where(Tenant.email == reference.lower())
        ).scalar_one_or_none()
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant


def list_tenants(limit=50, after_id=0):
    return db.session.execute(
        select(Tenant).where(Tenant.id > after_id).order_by(Tenant.id).limit(limit)
    ).scalars().all()


def update_tenant(reference, plan=None, active=None, signature_scheme=None):
    tenant = find_tenant(reference)
    if plan is not None:
        tenant.plan = plan
    if active is not None:
        tenant.active = active
    if signature_scheme is not None:
        tenant.signature_scheme = signature_scheme
    db.session.commit()
    log.info("tenant updated", extra={"tenant_id": tenant.id, "plan": tenant.plan,
                                      "active": tenant.active})
    return tenant


def rotate_key(tenant_id, presented_digest=None):
    """Issue a new key and invalidate the old one in one conditional UPDATE.

    With `presented_digest` (a tenant rotating its own key) the UPDATE only matches while that
    key is still current, so of two concurrent rotations with one key exactly one wins.
    """
    api_key = crypto.new_api_key()
    statement = update(Tenant).where(Tenant.id == tenant_id, Tenant.active.is_(True))
    if presented_digest is not None:
        statement = statement.where(Tenant.api_key_digest == presented_digest)
    result = db.session.execute(
        statement.values(
            api_key_digest=crypto.key_digest(api_key),
            api_key_prefix=crypto.display_prefix(api_key),
            key_rotated_at=utcnow(),
        )
    )
    if result.rowcount != 1:
        db.session.rollback()
        raise Unauthorized("Invalid or inactive API key")
    db.session.commit()
    log.info("tenant key rotated", extra={"tenant_id": tenant_id})
    return api_key


def rotate_signing_secret(reference, grace_seconds=0):
    """Issue a new response signing secret; the old one verifies for `grace_seconds` more."""
    tenant = find_tenant(reference)
    signing_secret = crypto.new_signing_secret()
    if grace_seconds > 0:
        tenant.previous_signing_secret_sealed = tenant.signing_secret_sealed
        tenant.previous_signing_secret_expires_at = now_seconds() + grace_seconds
    else:
        tenant.previous_signing_secret_sealed = None
        tenant.previous_signing_secret_expires_at = None
    tenant.signing_secret_sealed = crypto.seal(signing_secret)
    db.session.commit()
    log.info("tenant signing secret rotated", extra={"tenant_id": tenant.id,
                                                     "grace_seconds": grace_seconds})
    return signing_secret


def current_usage_count(tenant_id):
    count = db.session.execute(
        select(MonthlyUsage.usage_count).where(
            MonthlyUsage.tenant_id == tenant_id, MonthlyUsage.period == billing_period()
        )
    ).scalar()
    return count or 0


def usage(tenant, usage_count=None):
    """The usage object of SPEC.md for the current billing period."""
    if usage_count is None:
        usage_count = current_usage_count(tenant.id)
    limit = monthly_limit(tenant.plan)
    return {
        "email": tenant.email,
        "plan": tenant.plan,
        "usage_count": usage_count,
        "rate_limit": limit,
        "remaining": None if limit is None else max(limit - usage_count, 0),
    }
