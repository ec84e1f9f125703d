"""Tenant operations, shared by the HTTP API and the flask CLI. Each function is one transaction."""
import logging
from dataclasses import dataclass

from sqlalchemy import select

from app import crypto
from app.clock import billing_period, now_seconds
from app.errors import NotFound
from app.extensions import db
from app.sql import MAX_ID, insert_unique
from app.tenants import audit, key_cache, keys, mail, metering, scopes, signing
from app.tenants.models import Tenant
from app.tenants.tenant_row import locked_tenant
from app.tenants.plans import PAID_PLANS, monthly_limit
from app.webhooks import events

log = logging.getLogger(__name__)


@dataclass
class Provisioned:
    """A new tenant with the plaintext key and secret: the only time they exist unhashed."""

    tenant: Tenant
    api_key: str
    signing_secret: str
    email_sent: bool | None = None
    email_error: str | None = None


def create_tenant(email, plan):
    signing_secret = crypto.new_signing_secret()
    tenant = insert_unique(Tenant, {
        "email": email.lower(),
        "plan": plan,
        "active": True,
        "signing_secret_sealed": crypto.seal(signing_secret),
        "signature_scheme": "bound",
    }, "a tenant with this email already exists")
    # A tenant's first key holds every scope: it is how the tenant makes narrower ones.
    key, api_key = keys.issue(tenant.id, scopes.ALL)
    events.set_thresholds(tenant.id, events.DEFAULT_THRESHOLDS)
    audit.record(tenant.id, "tenant.created", plan=plan, key_id=key.id, prefix=key.prefix,
                 scopes=scopes.listed(key.scopes))
    log.info("tenant created", extra={"tenant_id": tenant.id, "plan": plan})
    return Provisioned(tenant, api_key, signing_secret)


def deliver_keys(provisioned):
    """Email a committed tenant its key and secret (paid plans: keys follow a purchase)."""
    tenant = provisioned.tenant
    if tenant.plan not in PAID_PLANS:
        # Say so rather than drop the request in silence.
        provisioned.email_sent = False
        provisioned.email_error = "keys are emailed on paid plans only: " + ", ".join(PAID_PLANS)
        return provisioned
    # The tenant exists whatever happens here: a failed delivery is reported, and the key can
    # then only be re-issued by rotation (it is not stored in a readable form).
    provisioned.email_sent, provisioned.email_error = mail.send_api_key(
        tenant.email, tenant.plan, provisioned.api_key, provisioned.signing_secret)
    return provisioned


def find_tenant(reference):
    """Look a tenant up by numeric id or by email."""
    reference = str(reference).strip()
    if reference.isascii() and reference.isdigit():  # "²" is a digit to isdigit, not to int
        tenant_id = int(reference)
        tenant = db.session.get(Tenant, tenant_id) if 0 < tenant_id <= MAX_ID else None
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


def _raise_reached_thresholds(tenant_id, plan_limit):
    """A move to a limited plan can put the month past usage alerts at once: no verification
    will cross them this month (the first refused ones count nothing), so the move raises
    them, once each as a verification would."""
    period = billing_period()
    usage_count = db.session.execute(select(metering.month_total(tenant_id, period))).scalar()
    db.session.execute(events.threshold_statement(reached=True), {
        "tenant_id": tenant_id, "period": period, "plan_limit": plan_limit,
        "usage_count": usage_count, "event_id": events.new_event_id(), "now": now_seconds()})


def update_tenant(reference, plan=None, active=None, signature_scheme=None):
    tenant_id = find_tenant(reference).id
    if (plan is not None and monthly_limit(plan) is not None
            and db.session.get_bind().dialect.name == "postgresql"):
        # Verifications in flight commit first, so that the fold below counts them
        # (metering.PLAN_LOCK). Before the row's lock: their counts take a key-share lock on
        # the tenant's row (a foreign key), which the row's lock would hold them from.
        db.session.execute(metering.plan_lock_statement(), {"tenant_id": tenant_id})
    # Judged under the row's lock: of concurrent identical changes, one changes and is audited.
    tenant = locked_tenant(tenant_id)
    # What the key cache keeps of this tenant no longer holds after a deactivation, or a move
    # to a limited plan (only an unlimited plan's principals are kept: app.tenants.key_cache).
    forget_kept = False
    if plan is not None and plan != tenant.plan:
        audit.record(tenant.id, "plan.changed", old=tenant.plan, new=plan)
        tenant.plan = plan
        if monthly_limit(plan) is not None:
            db.session.flush()  # the tenant's row first: its lock orders concurrent changes
            db.session.execute(metering.fold_statement(),
                               {"tenant_id": tenant.id, "period": billing_period()})
            _raise_reached_thresholds(tenant.id, monthly_limit(plan))
            forget_kept = True
    if active is not None and active != tenant.active:
        audit.record(tenant.id, "tenant.activated" if active else "tenant.deactivated")
        tenant.active = active
        forget_kept = forget_kept or not active
    if forget_kept:
        key_cache.forget_when_committed(key.key_digest for key in keys.list_keys(tenant.id))
    if signature_scheme is not None:
        signing.set_signature_scheme(tenant.id, signature_scheme)
    db.session.flush()
    log.info("tenant updated", extra={"tenant_id": tenant.id, "plan": tenant.plan,
                                      "active": tenant.active})
    return tenant


def rotate_signing_secret(reference, grace_seconds=0):
    """Issue a new response signing secret; the old one verifies for `grace_seconds` more.
    Returns the secret and until when the previous one verifies (None: no longer)."""
    # The current secret is read under the row's lock: read before it, the last of concurrent
    # rotations kept as previous the secret it read, and the one rotated just before it (shown
    # to its caller, with a grace) verified nowhere.
    tenant = locked_tenant(find_tenant(reference).id)
    signing_secret = crypto.new_signing_secret()
    grace_seconds = crypto.grace_for(tenant.signing_secret_sealed, grace_seconds,
                                     tenant_id=tenant.id)
    if grace_seconds > 0:
        tenant.previous_signing_secret_sealed = tenant.signing_secret_sealed
        tenant.previous_signing_secret_expires_at = now_seconds() + grace_seconds
    else:
        tenant.previous_signing_secret_sealed = None
        tenant.previous_signing_secret_expires_at = None
    tenant.signing_secret_sealed = crypto.seal(signing_secret)
    audit.record(tenant.id, "signing_secret.rotated", grace_seconds=grace_seconds)
    db.session.flush()
    log.info("tenant signing secret rotated", extra={"tenant_id": tenant.id,
                                                     "grace_seconds": grace_seconds})
    return signing_secret, tenant.previous_signing_secret_expires_at


def current_usage_count(tenant_id):
    """Every verification this month, whatever the plan was: the sum of its days."""
    return db.session.execute(
        select(metering.usage_count(tenant_id, billing_period()))).scalar_one()


def usage(tenant):
    """The usage object of SPEC.md for the current billing period."""
    usage_count = current_usage_count(tenant.id)
    limit = monthly_limit(tenant.plan)
    # SPEC.md: remaining equals rate_limit - usage_count, even below 0 after a downgrade.
    return {
        "email": tenant.email,
        "plan": tenant.plan,
        "usage_count": usage_count,
        "rate_limit": limit,
        "remaining": None if limit is None else limit - usage_count,
    }
