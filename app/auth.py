"""Authentication by X-Service-Key, for tenant keys and admin keys alike.

Every request looks the key up in the database by its SHA-256 digest: nothing is cached in the
process, so a rotated or deactivated key is refused by every worker from the moment it changes.
"""
import re
from dataclasses import dataclass
from functools import wraps

from flask import current_app, g, request
from sqlalchemy import and_, bindparam, select

from app import crypto
from app.admin.models import AdminKey
from app.clock import billing_period
from app.errors import Forbidden, Unauthorized, Unavailable
from app.extensions import db
from app.tenants.models import MonthlyUsage, Tenant
from app.traffic import limits

KEY_HEADER = "X-Service-Key"
KEY_PATTERN = re.compile(r"key_live_[0-9a-f]{48}")

# Per-endpoint 401 texts from SPEC.md: (missing key, invalid key).
GATE_TEXTS = ("invalid or missing X-Service-Key", "invalid or missing X-Service-Key")
ACCOUNT_TEXTS = ("Missing X-Service-Key header", "Invalid or inactive API key")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant (with its usage this month) or an admin key. `account` is the
    row of tenants or admin_keys, read once for the request."""

    kind: str
    id: int
    key_digest: str
    account: object
    usage_count: int = 0

    @property
    def tenant(self):
        return self.account if self.kind == "tenant" else None

    @property
    def owner(self):
        """A stable name for rate limiting and record ownership; never derived from the key."""
        return f"{self.kind}:{self.id}"


# Core statements built once, returning plain rows: the caller's account is read-only for the
# request, and ORM objects would cost more than the query itself on the hot path.
_TENANTS, _USAGE, _ADMIN_KEYS = Tenant.__table__, MonthlyUsage.__table__, AdminKey.__table__
_TENANT_BY_DIGEST = (
    select(_TENANTS, _USAGE.c.usage_count)
    .select_from(_TENANTS.outerjoin(_USAGE, and_(_USAGE.c.tenant_id == _TENANTS.c.id,
                                                 _USAGE.c.period == bindparam("period"))))
    .where(_TENANTS.c.api_key_digest == bindparam("digest"))
)
_ADMIN_BY_DIGEST = select(_ADMIN_KEYS).where(_ADMIN_KEYS.c.key_digest == bindparam("digest"),
                                             _ADMIN_KEYS.c.active.is_(True))


def _find_tenant(digest):
    tenant = db.session.connection().execute(
        _TENANT_BY_DIGEST, {"digest": digest, "period": billing_period()}
    ).first()
    if tenant is None or not tenant.active or not crypto.digests_match(tenant.api_key_digest, digest):
        return None
    return Principal("tenant", tenant.id, digest, tenant, usage_count=tenant.usage_count or 0)


def _find_admin(digest):
    admin_key = db.session.connection().execute(_ADMIN_BY_DIGEST, {"digest": digest}).first()
    if admin_key is None or not crypto.digests_match(admin_key.key_digest, digest):
        return None
    return Principal("admin", admin_key.id, digest, admin_key)


def resolve(api_key):
    """Return the Principal holding this key, or None."""
    if not KEY_PATTERN.fullmatch(api_key):
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
            principal = resolve(api_key) if api_key else None
            if principal is None:
                limits.record_failed_authentication()
                raise Unauthorized(texts[1] if api_key else texts[0])
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
