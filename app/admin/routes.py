"""Admin HTTP API for internal services: provisioning and managing tenants."""
from app.auth import ACCOUNT_TEXTS, authenticate
from app.errors import NotFound
from app.openapi import Blueprint
from app.schemas import Extended
from app.sql import MAX_ID, unit_of_work
from app.tenants import self_service, service
from app.traffic import limits
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
    TenantCreatedSchema,
    TenantCreateSchema,
    TenantListQuerySchema,
    TenantListSchema,
    TenantSchema,
    TenantUpdateSchema,
)

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")
limits.declare(bp)

admin_only = authenticate(kinds=("admin",), texts=ACCOUNT_TEXTS)

TENANT_NOT_FOUND = "`tenant not found`."


def _describe(tenant, **extra):
    """A tenant as the admin API shows it: with this month's usage (and any extra fields)."""
    return Extended(tenant, usage=service.usage(tenant), **extra)


@bp.post("/tenants")
@bp.response(201, TenantCreatedSchema)
@bp.error(409, "`a tenant with this email already exists`.")
@admin_only
@bp.arguments(TenantCreateSchema)
def create_tenant(fields):
    """Provision a tenant; its API key and signing secret are shown this once"""
    send_email = fields.pop("send_email")
    with unit_of_work():
        provisioned = service.create_tenant(**fields)
    if send_email:
        service.deliver_keys(provisioned)
    return _describe(provisioned.tenant, api_key=provisioned.api_key,
                     signing_secret=provisioned.signing_secret,
                     email_sent=provisioned.email_sent, email_error=provisioned.email_error)


@bp.get("/tenants")
@bp.response(200, TenantListSchema)
@admin_only
@bp.arguments(TenantListQuerySchema, location="query")
def list_tenants(query):
    """List tenants by id, `limit` at a time"""
    tenants = service.list_tenants(limit=query["limit"], after_id=query["starting_after"])
    return {"tenants": tenants, "has_more": len(tenants) == query["limit"]}


@bp.get("/tenants/<int:tenant_id>")
@bp.response(200, TenantSchema)
@bp.error(404, TENANT_NOT_FOUND)
@admin_only
def show_tenant(tenant_id):
    """Read a tenant and this month's usage"""
    return _describe(service.find_tenant(_tenant(tenant_id)))


@bp.patch("/tenants/<int:tenant_id>")
@bp.response(200, TenantSchema)
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.SCHEME_CONFLICT)
@admin_only
@bp.arguments(TenantUpdateSchema)
def update_tenant(changes, tenant_id):
    """Change plan, active flag or signature scheme"""
    with unit_of_work():
        tenant = service.update_tenant(_tenant(tenant_id), **changes)
    return _describe(tenant)


# Tenant self-service for any tenant: the tenant API's operations, with the tenant in the path.

@bp.get("/tenants/<int:tenant_id>/keys")
@bp.response(200, ApiKeyListSchema)
@bp.error(404, TENANT_NOT_FOUND)
@admin_only
def list_api_keys(tenant_id):
    """A tenant's active API keys (never a secret)"""
    return self_service.list_api_keys(_tenant(tenant_id))


@bp.post("/tenants/<int:tenant_id>/keys")
@bp.response(201, ApiKeyCreatedSchema)
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.KEY_CONFLICT)
@admin_only
@bp.arguments(ApiKeyCreateSchema)
def create_api_key(fields, tenant_id):
    """Create an API key for a tenant; it is shown this once"""
    return self_service.create_api_key(_tenant(tenant_id), fields)


@bp.delete("/tenants/<int:tenant_id>/keys/<key_id>")
@bp.response(200, RevokedApiKeySchema)
@bp.error(404, TENANT_NOT_FOUND + " Or " + self_service.KEY_NOT_FOUND)
@bp.error(409, self_service.KEY_CONFLICT)
@admin_only
def revoke_api_key(tenant_id, key_id):
    """Revoke a tenant's API key"""
    return self_service.revoke_api_key(_tenant(tenant_id), key_id)


@bp.get("/tenants/<int:tenant_id>/signing-keys")
@bp.response(200, SigningKeyListSchema)
@bp.error(404, TENANT_NOT_FOUND)
@admin_only
def list_signing_keys(tenant_id):
    """A tenant's Ed25519 signing keys"""
    return self_service.list_signing_keys(_tenant(tenant_id))


@bp.post("/tenants/<int:tenant_id>/signing-keys")
@bp.response(201, SigningKeySchema)
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.SIGNING_KEY_CONFLICT)
@admin_only
@bp.arguments(SigningKeyCreateSchema)
def add_signing_key(fields, tenant_id):
    """Register an Ed25519 public key for a tenant"""
    return self_service.add_signing_key(_tenant(tenant_id), fields)


@bp.delete("/tenants/<int:tenant_id>/signing-keys/<key_id>")
@bp.response(200, RevokedSigningKeySchema)
@bp.error(404, TENANT_NOT_FOUND + " Or `signing key not found`.")
@bp.error(409, self_service.SIGNING_KEY_CONFLICT)
@admin_only
def revoke_signing_key(tenant_id, key_id):
    """Revoke a tenant's signing key"""
    return self_service.revoke_signing_key(_tenant(tenant_id), key_id)


@bp.put("/tenants/<int:tenant_id>/signature-scheme")
@bp.response(200, SignatureSchemeSchema)
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, self_service.SCHEME_CONFLICT)
@admin_only
@bp.arguments(SignatureSchemeRequestSchema)
def set_signature_scheme(fields, tenant_id):
    """Switch a tenant's signature scheme, with a grace"""
    return self_service.set_signature_scheme(_tenant(tenant_id), fields)


@bp.post("/tenants/<int:tenant_id>/signing-secret/rotate")
@bp.response(200, SigningSecretSchema)
@bp.error(404, TENANT_NOT_FOUND)
@admin_only
@bp.arguments(SigningSecretRotateSchema, required=False)
def rotate_signing_secret(fields, tenant_id):
    """Issue a new HMAC signing secret for a tenant, shown this once"""
    return self_service.rotate_signing_secret(_tenant(tenant_id), fields)


@bp.get("/tenants/<int:tenant_id>/audit-log")
@bp.response(200, AuditLogSchema)
@bp.error(404, TENANT_NOT_FOUND)
@admin_only
@bp.arguments(AuditLogQuerySchema, location="query")
def audit_log(query, tenant_id):
    """A tenant's audit log, newest first"""
    return self_service.audit_log(_tenant(tenant_id), query)


@bp.get("/tenants/<int:tenant_id>/usage/daily")
@bp.response(200, DailyUsageSchema)
@bp.error(404, TENANT_NOT_FOUND)
@admin_only
@bp.arguments(DailyUsageQuerySchema, location="query")
def daily_usage(query, tenant_id):
    """A tenant's verifications per UTC day by outcome"""
    return self_service.daily_usage(_tenant(tenant_id), query)


def _tenant(tenant_id):
    if tenant_id > MAX_ID:
        raise NotFound("tenant not found")
    return tenant_id
