"""Admin HTTP API for internal services: provisioning and managing tenants (a tenant's
self-service operations, for any tenant, are app.tenants.self_service_routes)."""
from app.auth import ACCOUNT_TEXTS, authenticate
from app.errors import NotFound
from app.openapi import Blueprint
from app.schemas import Extended
from app.sql import MAX_ID, unit_of_work
from app.tenants import self_service, service
from app.traffic import limits
from app.tenants.schemas import (
    TenantCreatedSchema,
    TenantCreateSchema,
    TenantListQuerySchema,
    TenantListSchema,
    TenantSchema,
    TenantUpdateSchema,
)

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")
limits.declare(bp)

# Operators: an admin key holds every scope, so these name none.
admin_only = authenticate(kinds=("admin",), texts=ACCOUNT_TEXTS, scope=None)

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
    # One more than the page holds: whether it exists is has_more, so the last page says false.
    tenants = service.list_tenants(limit=query["limit"] + 1, after_id=query["starting_after"])
    return {"tenants": tenants[:query["limit"]], "has_more": len(tenants) > query["limit"]}


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


def _tenant(tenant_id):
    if tenant_id > MAX_ID:
        raise NotFound("tenant not found")
    return tenant_id
