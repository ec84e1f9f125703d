"""Authentication by X-Service-Key, for tenant keys and admin keys alike.

Every request looks the key up in the database by its SHA-256 digest: nothing is cached in the
process, so a rotated or deactivated key is refused by every worker from the moment it changes.
"""
import re
from dataclasses import dataclass
from functools import wraps

from flask import current_app, g, request
from sqlalchemy import and_, select

from app import crypto
from app.admin.models import AdminKey
from app.clock import billing_period
from app.errors import Forbidden, Unauthorized, Unavailable
from app.extensions import db
from app.tenants.models import MonthlyUsage, Tenant
from app.traffic import limits

KEY_HEADER = "X-Service-Key"
KEY_PATTERN = re.compile(r"^key_live_[0-9a-f]{48}$")

# Per-endpoint 401 texts from SPEC.md: (missing key, invalid key).
GATE_TEXTS = ("invalid or missing X-Service-Key", "invalid or missing X-Service-Key")
ACCOUNT_TEXTS = ("Missing X-Service-Key header", "Invalid or inactive API key")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant (with its current usage) or an admin key."""

    kind: str
    id: int
    key_digest: str
    account: Tenant | AdminKey
    usage_count: int = 0

    @property
    def tenant(self):
        return self.account if self.kind == "tenant" else None

    @property
    def owner(self):
        """A stable name for rate limiting and record ownership; never derived from the key."""
        return f"{self.kind}:{self.id}"


def _find_tenant(digest):
    row = db.session.execute(
        select(Tenant, MonthlyUsage.usage_count)
        .outerjoin(
            MonthlyUsage,
            and_(MonthlyUsage.tenant_id == Tenant.id, MonthlyUsage.period == billing_period()),
        )
        .where(Tenant.api_key_digest == digest)
    ).first()
    if row is None or not row[0].active:
        return None
    tenant, usage_count = row
    if not crypto.digests_match(tenant.api_key_digest, digest):
        return None
    return Principal("tenant", tenant.id, digest, tenant, usage_count=usage_count or 0)


def _find_admin(digest):
    admin_key = db.session.execute(
        select(AdminKey).where(AdminKey.key_digest == digest, AdminKey.active.is_(True))
    ).scalar_one_or_none()
    if admin_key is None or not crypto.digests_match(admin_key.key_digest, digest):
        return None
    return Principal("admin", admin_key.id, digest, admin_key)


def resolve(api_key):
    """Return the Principal holding this key, or None."""
    if not KEY_PATTERN.match(api_key):
        return None
    digest = crypto.key_digest(api_key)
    if current_app.config["MULTI_TENANCY"]:
        principal = _find_tenant(digest)
        if principal is not None:
            return principal
    return _find_admin(digest)


def authenticate(kinds=("tenant", "admin"), texts=GATE_TEXTS):
    """Require a valid key of one of `kinds`; the caller is put in g.principal."""

    def decorator(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            if kinds == ("tenant",) and not current_app.config["MULTI_TENANCY"]:
                raise Unavailable("Multi-tenancy not configured")
            api_key = request.headers.get(KEY_HEADER)
            if not api_key:
                raise Unauthorized(texts[0])
            principal = resolve(api_key)
            if principal is None:
                raise Unauthorized(texts[1])
            if principal.kind not in kinds:
                raise Forbidden(_wrong_kind_text(kinds))
            g.principal = principal
            limits.take_request_token(principal)
            return view(*args, **kwargs)

        return wrapper

    return decorator


def _wrong_kind_text(kinds):
    if kinds == ("admin",):
        return "this endpoint requires an admin key"
    return "this endpoint requires a tenant key"
