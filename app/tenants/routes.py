"""The tenant's own account as SPEC.md has it: usage and key rotation, with a tenant key of any
scope (the self-service operations are app.tenants.self_service_routes)."""
from flask import g

from app.auth import ACCOUNT_TEXTS, authenticate
from app.openapi import Blueprint
from app.schemas import RequestSchema
from app.sql import unit_of_work
from app.tenants import keys, service
from app.tenants.schemas import RotateKeySchema, UsageSchema
from app.traffic import limits

bp = Blueprint("tenant", __name__, url_prefix="/v1/tenant")
limits.declare(bp)

ROTATED_MESSAGE = "A new API key has been issued; the previous key is now invalid."

# SPEC.md's usage and rotate-key need no scope: any key of the tenant reads its usage and
# rotates itself (the new key holds the old one's scopes).
tenant_only = authenticate(kinds=("tenant",), texts=ACCOUNT_TEXTS, scope=None)


class RotateKeyRequestSchema(RequestSchema):
    """Rotation takes no fields: an empty body or {} is fine, any field is 400 as everywhere."""


@bp.get("/usage")
@bp.response(200, UsageSchema)
@tenant_only
def usage():
    """This month's usage against the plan"""
    return service.usage(g.principal.tenant)


@bp.post("/rotate-key")
@bp.response(200, RotateKeySchema)
@tenant_only
@bp.arguments(RotateKeyRequestSchema, required=False)
def rotate_key(_no_fields):
    """Replace the calling key by a new one; the old one is invalid at once"""
    with unit_of_work():
        new_key, _ = keys.rotate(g.principal.id, key_id=g.principal.account.api_key_id)
    return {"new_key": new_key, "message": ROTATED_MESSAGE}
