"""Authentication by X-Service-Key, for tenant keys and admin keys alike.

Every request looks the key up in the database by its SHA-256 digest: nothing is cached in the
process, so a rotated or deactivated key is refused by every worker from the moment it changes.
Authentication says who calls and whether the key holds the scope the view declares (every
view names its scope, or None, where it declares its authentication: a new view cannot forget
it, and the OpenAPI document shows it as `x-scope`). Once it knows who calls (or that nobody
could be authenticated) it checks the request's rate limits, once: app.traffic.limits.check,
the caller's bucket or the address's failure allowance.

The intent endpoints (`cached=True`) take a tenant's principal from app.tenants.key_cache when it
is there: their one write confirms it (its fingerprint). Any other outcome (StaleCredentials:
it no longer matches and nothing was written; an error answer; a 429 from its bucket) is
decided again on a fresh lookup: the view runs once more, without a second rate-limit check,
or the request is answered 401 when the key no longer authenticates.
"""
import re
from dataclasses import dataclass
from functools import wraps

from flask import current_app, g, request
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException

from app import crypto
from app.admin import service as admin_service
from app.errors import (ApiError, Forbidden, NotFound, TooManyRequests, Unauthorized,
                        Unavailable)
from app.http import no_body
from app.openapi import Blueprint
from app.sql import MAX_ID
from app.tenants import key_cache, keys, scopes as key_scopes
from app.tenants.tenant_row import INACTIVE_KEY
from app.traffic import limits

KEY_HEADER = "X-Service-Key"
# What a view answers other than success: StaleCredentials and the error answers.
_ANSWERS = (key_cache.StaleCredentials, ApiError, HTTPException, ValidationError)
KEY_PATTERN = re.compile(r"key_live_[0-9a-f]{48}")

# Per-endpoint 401 texts from SPEC.md: (missing key, invalid key).
GATE_TEXTS = ("invalid or missing X-Service-Key", "invalid or missing X-Service-Key")
ACCOUNT_TEXTS = ("Missing X-Service-Key header", INACTIVE_KEY)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant (with its count against a limited plan this month, which
    metering.refuse_if_over_plan reads) or an admin key. `account` is the row read once for
    the request: the tenant with the calling key's id and prefix, or the admin key. `scopes`:
    what the key may do; an admin key is an operator and holds all."""

    kind: str
    id: int
    account: object
    usage_count: int = 0
    scopes: frozenset = key_scopes.ALL
    # Set when the principal came from app.tenants.key_cache: the write it authorizes checks
    # it against the database (None: just read from the database, nothing to confirm).
    fingerprint: str | None = None

    @property
    def operator(self):
        """An admin key: it may do what no tenant key may (the payload scheme, any scope)."""
        return self.kind == "admin"

    @property
    def tenant(self):
        return self.account if self.kind == "tenant" else None

    @property
    def owner(self):
        """A stable name for rate limiting and record ownership; never derived from the key."""
        return f"{self.kind}:{self.id}"


def resolve(api_key, cached=False, fresh=False):
    """Return the Principal holding this key, or None. `cached`: a tenant's principal may come
    from the key cache (unless `fresh`), and a fresh lookup refreshes the cache."""
    if not KEY_PATTERN.fullmatch(api_key):
        return None
    digest = crypto.key_digest(api_key)
    if current_app.config["MULTI_TENANCY"]:
        kept = key_cache.get(digest) if cached and not fresh else None
        if kept is not None:
            return _tenant_principal(kept, fingerprint=kept.fingerprint)
        tenant = keys.find_by_key_digest(digest)
        if tenant is not None and tenant.active:
            if cached:
                key_cache.put(tenant, replacing=fresh)
            return _tenant_principal(tenant)
        if cached and fresh:  # what was kept no longer authenticates
            key_cache.forget(digest)
    admin_key = admin_service.find_by_key_digest(digest)
    if admin_key is not None:
        return Principal("admin", admin_key.id, admin_key)
    return None


def _tenant_principal(tenant, fingerprint=None):
    return Principal("tenant", tenant.id, tenant, getattr(tenant, "usage_count", None) or 0,
                     key_scopes.held(tenant.scopes), fingerprint)


def authenticated(kinds, texts, cached=False):
    """The caller, put in g.principal, if its key is valid and of one of `kinds`."""
    if kinds == ("tenant",) and not current_app.config["MULTI_TENANCY"]:
        raise Unavailable("Multi-tenancy not configured")
    api_key = request.headers.get(KEY_HEADER)
    principal = resolve(api_key, cached) if api_key else None
    if principal is None:
        limits.check()  # the address's failure allowance: 429 once it is spent
        # An empty header is present: it is an invalid key, not a missing one.
        raise Unauthorized(texts[1] if api_key is not None else texts[0])
    g.principal = principal
    try:
        limits.check()  # the caller's bucket, before the view does anything
    except TooManyRequests:
        if principal.fingerprint is not None:
            reauthenticated(texts)  # a key that no longer authenticates: 401, not its 429
        raise
    # After the bucket: a request of the wrong kind of key is a request of its caller on a
    # /v1/* endpoint like any other (a tenant key on the admin API would otherwise spend no
    # bucket at all, and cost a key lookup each time without limit).
    if principal.kind not in kinds:
        raise Forbidden(_wrong_kind_text(kinds))
    return principal


def reauthenticated(texts):
    """After a kept principal's request did not succeed (StaleCredentials, an error answer, its
    bucket's 429): the caller afresh from the database, its bucket already spent.
    A key that no longer authenticates is answered 401 (its kept principal is forgotten, so
    its next request is a failed authentication like any other)."""
    principal = resolve(request.headers[KEY_HEADER], cached=True, fresh=True)
    if principal is None or principal.kind != g.principal.kind:
        raise Unauthorized(texts[1])
    g.principal = principal
    return principal


def confirm_principal():
    """For a view that reads or writes before the statement that confirms a kept principal
    (a stored verdict): go through the database first."""
    if g.principal.fingerprint is not None:
        raise key_cache.StaleCredentials()


def _declares(scope):
    """Record the view's scope in the OpenAPI document, from this very declaration."""
    return Blueprint.doc(**{"x-scope": scope})


def authenticate(kinds=("tenant", "admin"), texts=GATE_TEXTS, *, scope, cached=False):
    """Require a valid key of one of `kinds` holding `scope` (None: no scope is needed, as for
    SPEC.md's usage and rotate-key, or the view is an operator's). `cached`: the view's writes
    confirm a principal from the key cache (see the module's docstring)."""

    def decorator(view):
        reads_body = getattr(view, "reads_body", False)

        def run(principal, *args, **kwargs):
            if scope is not None:
                key_scopes.require(principal.scopes, scope)
            if not reads_body:
                no_body()
            return view(*args, **kwargs)

        @wraps(view)
        def wrapper(*args, **kwargs):
            principal = authenticated(kinds, texts, cached)
            try:
                return run(principal, *args, **kwargs)
            except _ANSWERS:
                if principal.fingerprint is None:
                    raise
            # A kept principal's request that did not succeed through the write confirming it:
            # decided again on a fresh lookup, so every refusal is the database's (a revoked
            # key with a bad body is a 401, as it always was).
            return run(reauthenticated(texts), *args, **kwargs)

        return _declares(scope)(wrapper)

    return decorator


def for_tenant(scope):
    """A self-service operation served on two paths by one view: under /v1/tenant for the
    calling tenant's key, which must hold `scope`, and under /v1/admin/tenants/<tenant_id> for
    an admin key acting on any tenant (an operator holds every scope). The view receives the
    tenant as `tenant_id` either way."""

    def decorator(view):
        reads_body = getattr(view, "reads_body", False)

        @wraps(view)
        def wrapper(*args, tenant_id=None, **kwargs):
            if tenant_id is None:
                principal = authenticated(("tenant",), ACCOUNT_TEXTS)
                key_scopes.require(principal.scopes, scope)
                tenant_id = principal.id
            else:
                authenticated(("admin",), ACCOUNT_TEXTS)
                if tenant_id > MAX_ID:
                    raise NotFound("tenant not found")
            if not reads_body:
                no_body()
            return view(*args, tenant_id=tenant_id, **kwargs)

        return _declares(scope)(wrapper)

    return decorator


def _wrong_kind_text(kinds):
    if kinds == ("admin",):
        return "this endpoint requires an admin key"
    return "this endpoint requires a tenant key"
