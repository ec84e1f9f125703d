"""Admin HTTP API for internal services: provisioning and managing tenants."""
import re

from flask import Blueprint, request

from app.auth import ACCOUNT_TEXTS, authenticate
from app.errors import BadRequest, NotFound
from app.http import json_body
from app.tenants import service
from app.tenants.schemas import (
    tenant_create_schema,
    tenant_schema,
    tenant_update_schema,
    tenants_schema,
)

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")

MAX_ID = 2**31 - 1  # tenant ids are 32-bit integers in the database

admin_only = authenticate(kinds=("admin",), texts=ACCOUNT_TEXTS)


def _describe(tenant):
    body = tenant_schema.dump(tenant)
    body["usage"] = service.usage(tenant)
    return body


@bp.post("/tenants")
@admin_only
def create_tenant():
    fields = tenant_create_schema.load(json_body())
    provisioned = service.create_tenant(**fields)
    body = _describe(provisioned.tenant)
    body.update(api_key=provisioned.api_key, signing_secret=provisioned.signing_secret,
                email_sent=provisioned.email_sent, email_error=provisioned.email_error)
    return body, 201


@bp.get("/tenants")
@admin_only
def list_tenants():
    limit = _query_integer("limit", 50, 1, 200)
    after = _query_integer("starting_after", 0, 0, MAX_ID)
    tenants = service.list_tenants(limit=limit, after_id=after)
    return {"tenants": tenants_schema.dump(tenants), "has_more": len(tenants) == limit}


@bp.get("/tenants/<int:tenant_id>")
@admin_only
def show_tenant(tenant_id):
    return _describe(service.find_tenant(_tenant(tenant_id)))


@bp.patch("/tenants/<int:tenant_id>")
@admin_only
def update_tenant(tenant_id):
    changes = tenant_update_schema.load(json_body())
    return _describe(service.update_tenant(_tenant(tenant_id), **changes))


def _tenant(tenant_id):
    if tenant_id > MAX_ID:
        raise NotFound("tenant not found")
    return tenant_id


def _query_integer(name, default, minimum, maximum):
    raw = request.args.get(name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,10}", raw) or not minimum <= int(raw) <= maximum:
        raise BadRequest(f"{name} must be an integer between {minimum} and {maximum}")
    return int(raw)
