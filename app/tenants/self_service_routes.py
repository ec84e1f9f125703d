"""Tenant self-service, one view per operation on two paths (CONTRACT.md, Tenant self-service):
under /v1/tenant for the calling tenant's key, which must hold the operation's scope, and under
/v1/admin/tenants/<tenant_id> for an admin key acting on any tenant. Who the tenant is and who
may call is decided in one place, app.auth.for_tenant; the views are the same for both."""
from flask import g

from app.auth import for_tenant
from app.openapi import Blueprint
from app.tenants import scopes, self_service
from app.tenants.schemas import (
    ApiKeyCreatedSchema,
    ApiKeyCreateSchema,
    ApiKeyListSchema,
    AuditLogQuerySchema,
    AuditLogSchema,
    DailyUsageQuerySchema,
    DailyUsageSchema,
    RevokedApiKeySchema,
    RevokedSigningKeySchema,
    SignatureSchemeRequestSchema,
    SignatureSchemeSchema,
    SigningKeyCreateSchema,
    SigningKeyListSchema,
    SigningKeySchema,
    SigningSecretRotateSchema,
    SigningSecretSchema,
)
from app.traffic import limits

bp = Blueprint("self_service", __name__, url_prefix="/v1",
               description="A tenant's API keys, response signing, audit log and daily usage: "
                           "under /v1/tenant for the calling tenant's key (holding the "
                           "operation's x-scope), under /v1/admin/tenants/{tenant_id} for an "
                           "admin key acting on any tenant.")
limits.declare(bp)

TENANT_NOT_FOUND = "`tenant not found` (admin paths)."


def operation(method, rule, blueprint=bp):
    """Route one view on both paths of its operation (on `blueprint`, url_prefix /v1)."""

    def register(view):
        for prefix in ("/tenant", "/admin/tenants/<int:tenant_id>"):
            blueprint.route(prefix + rule, methods=[method])(view)
        return view

    return register


@operation("GET", "/keys")
@bp.response(200, ApiKeyListSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
def list_api_keys(tenant_id):
    """The tenant's active API keys with their scopes (never a secret)"""
    return self_service.list_api_keys(tenant_id)


@operation("POST", "/keys")
@bp.response(201, ApiKeyCreatedSchema)
@bp.error(403, f"`{scopes.CANNOT_GRANT}`, or the key lacks this operation's scope.")
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.KEY_CONFLICT)
@for_tenant(scopes.KEYS_WRITE)
@bp.arguments(ApiKeyCreateSchema)
def create_api_key(fields, tenant_id):
    """Create an API key holding the scopes asked for; it is shown this once"""
    return self_service.create_api_key(tenant_id, fields, g.principal)


@operation("DELETE", "/keys/<key_id>")
@bp.response(200, RevokedApiKeySchema)
@bp.error(404, TENANT_NOT_FOUND + " Or " + self_service.KEY_NOT_FOUND)
@bp.error(409, self_service.KEY_CONFLICT)
@for_tenant(scopes.KEYS_WRITE)
def revoke_api_key(tenant_id, key_id):
    """Revoke an API key: refused from this answer on; the last one cannot be"""
    return self_service.revoke_api_key(tenant_id, key_id)


@operation("GET", "/signing-keys")
@bp.response(200, SigningKeyListSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
def list_signing_keys(tenant_id):
    """The Ed25519 public keys that verify the AI service's responses, with fingerprints"""
    return self_service.list_signing_keys(tenant_id)


@operation("POST", "/signing-keys")
@bp.response(201, SigningKeySchema)
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.SIGNING_KEY_CONFLICT)
@for_tenant(scopes.SIGNING_WRITE)
@bp.arguments(SigningKeyCreateSchema)
def add_signing_key(fields, tenant_id):
    """Register an Ed25519 public key (never a private key; never the same key twice)"""
    return self_service.add_signing_key(tenant_id, fields)


@operation("DELETE", "/signing-keys/<key_id>")
@bp.response(200, RevokedSigningKeySchema)
@bp.error(404, TENANT_NOT_FOUND + " Or `signing key not found`.")
@bp.error(409, self_service.SIGNING_KEY_CONFLICT)
@for_tenant(scopes.SIGNING_WRITE)
def revoke_signing_key(tenant_id, key_id):
    """Revoke a signing key"""
    return self_service.revoke_signing_key(tenant_id, key_id)


@operation("PUT", "/signature-scheme")
@bp.response(200, SignatureSchemeSchema)
@bp.error(403, f"`{self_service.PAYLOAD_BY_OPERATOR}` (a tenant key), or the key lacks this "
               "operation's scope.")
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.SCHEME_CONFLICT)
@for_tenant(scopes.SIGNING_WRITE)
@bp.arguments(SignatureSchemeRequestSchema)
def set_signature_scheme(fields, tenant_id):
    """Switch the signature scheme; the previous one verifies during the grace"""
    return self_service.set_signature_scheme(tenant_id, fields, g.principal)


@operation("POST", "/signing-secret/rotate")
@bp.response(200, SigningSecretSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.SIGNING_WRITE)
@bp.arguments(SigningSecretRotateSchema, required=False)
def rotate_signing_secret(fields, tenant_id):
    """Issue a new HMAC signing secret, shown this once"""
    return self_service.rotate_signing_secret(tenant_id, fields)


@operation("GET", "/audit-log")
@bp.response(200, AuditLogSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
@bp.arguments(AuditLogQuerySchema, location="query")
def audit_log(query, tenant_id):
    """Changes to keys, secrets, scheme, plan and active flag, newest first"""
    return self_service.audit_log(tenant_id, query)


@operation("GET", "/usage/daily")
@bp.response(200, DailyUsageSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
@bp.arguments(DailyUsageQuerySchema, location="query")
def daily_usage(query, tenant_id):
    """Verifications per UTC day by outcome"""
    return self_service.daily_usage(tenant_id, query)
