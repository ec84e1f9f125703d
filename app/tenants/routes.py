"""The tenant's own account: usage, key rotation, and self-service (API keys, response signing,
audit log, daily usage). Every view here takes a tenant key."""
from flask import g

from app.auth import ACCOUNT_TEXTS, authenticate
from app.openapi import Blueprint
from app.schemas import RequestSchema
from app.sql import unit_of_work
from app.tenants import keys, self_service, service
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
    RotateKeySchema,
    SignatureSchemeRequestSchema,
    SignatureSchemeSchema,
    SigningKeyCreateSchema,
    SigningKeyListSchema,
    SigningKeySchema,
    SigningSecretRotateSchema,
    SigningSecretSchema,
    UsageSchema,
)
from app.traffic import limits

bp = Blueprint("tenant", __name__, url_prefix="/v1/tenant")
limits.declare(bp)

ROTATED_MESSAGE = "A new API key has been issued; the previous key is now invalid."

tenant_only = authenticate(kinds=("tenant",), texts=ACCOUNT_TEXTS)


class RotateKeyRequestSchema(RequestSchema):
    """Rotation takes no fields: an empty body or {} is fine, any field is 400 as everywhere."""


@bp.get("/usage")
@bp.response(200, UsageSchema)
@tenant_only
def usage():
    """This month's usage against the plan"""
    principal = g.principal
    return service.usage(principal.tenant, principal.usage_count)


@bp.post("/rotate-key")
@bp.response(200, RotateKeySchema)
@tenant_only
@bp.arguments(RotateKeyRequestSchema, required=False)
def rotate_key(_no_fields):
    """Replace the calling key by a new one; the old one is invalid at once"""
    with unit_of_work():
        new_key = keys.rotate(g.principal.id, key_id=g.principal.account.api_key_id)
    return {"new_key": new_key, "message": ROTATED_MESSAGE}


@bp.get("/keys")
@bp.response(200, ApiKeyListSchema)
@tenant_only
def list_api_keys():
    """The tenant's active API keys (never a secret)"""
    return self_service.list_api_keys(g.principal.id)


@bp.post("/keys")
@bp.response(201, ApiKeyCreatedSchema)
@bp.error(409, self_service.KEY_CONFLICT)
@tenant_only
@bp.arguments(ApiKeyCreateSchema)
def create_api_key(fields):
    """Create an API key; it is shown this once"""
    return self_service.create_api_key(g.principal.id, fields)


@bp.delete("/keys/<key_id>")
@bp.response(200, RevokedApiKeySchema)
@bp.error(404, self_service.KEY_NOT_FOUND)
@bp.error(409, self_service.KEY_CONFLICT)
@tenant_only
def revoke_api_key(key_id):
    """Revoke an API key: refused from this answer on; the last one cannot be"""
    return self_service.revoke_api_key(g.principal.id, key_id)


@bp.get("/signing-keys")
@bp.response(200, SigningKeyListSchema)
@tenant_only
def list_signing_keys():
    """The Ed25519 public keys that verify the AI service's responses"""
    return self_service.list_signing_keys(g.principal.id)


@bp.post("/signing-keys")
@bp.response(201, SigningKeySchema)
@bp.error(409, self_service.SIGNING_KEY_CONFLICT)
@tenant_only
@bp.arguments(SigningKeyCreateSchema)
def add_signing_key(fields):
    """Register an Ed25519 public key (never a private key)"""
    return self_service.add_signing_key(g.principal.id, fields)


@bp.delete("/signing-keys/<key_id>")
@bp.response(200, RevokedSigningKeySchema)
@bp.error(404, "`signing key not found`.")
@bp.error(409, self_service.SIGNING_KEY_CONFLICT)
@tenant_only
def revoke_signing_key(key_id):
    """Revoke a signing key"""
    return self_service.revoke_signing_key(g.principal.id, key_id)


@bp.put("/signature-scheme")
@bp.response(200, SignatureSchemeSchema)
@bp.error(409, self_service.SCHEME_CONFLICT)
@tenant_only
@bp.arguments(SignatureSchemeRequestSchema)
def set_signature_scheme(fields):
    """Switch the signature scheme; the previous one verifies during the grace"""
    return self_service.set_signature_scheme(g.principal.id, fields)


@bp.post("/signing-secret/rotate")
@bp.response(200, SigningSecretSchema)
@tenant_only
@bp.arguments(SigningSecretRotateSchema, required=False)
def rotate_signing_secret(fields):
    """Issue a new HMAC signing secret, shown this once"""
    return self_service.rotate_signing_secret(g.principal.id, fields)


@bp.get("/audit-log")
@bp.response(200, AuditLogSchema)
@tenant_only
@bp.arguments(AuditLogQuerySchema, location="query")
def audit_log(query):
    """Changes to keys, secrets, scheme, plan and active flag, newest first"""
    return self_service.audit_log(g.principal.id, query)


@bp.get("/usage/daily")
@bp.response(200, DailyUsageSchema)
@tenant_only
@bp.arguments(DailyUsageQuerySchema, location="query")
def daily_usage(query):
    """Verifications per UTC day by outcome"""
    return self_service.daily_usage(g.principal.id, query)
