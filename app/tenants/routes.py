"""The tenant's own account: usage and key rotation."""
from flask import Blueprint, g

from app.auth import ACCOUNT_TEXTS, authenticate
from app.http import json_body
from app.tenants import service
from app.tenants.schemas import rotate_key_schema, usage_schema

bp = Blueprint("tenant", __name__, url_prefix="/v1/tenant")

ROTATED_MESSAGE = "A new API key has been issued; the previous key is now invalid."


@bp.get("/usage")
@authenticate(kinds=("tenant",), texts=ACCOUNT_TEXTS)
def usage():
    principal = g.principal
    return usage_schema.dump(service.usage(principal.tenant, principal.usage_count))


@bp.post("/rotate-key")
@authenticate(kinds=("tenant",), texts=ACCOUNT_TEXTS)
def rotate_key():
    json_body(allow_empty=True)
    new_key = service.rotate_key(g.principal.id, presented_digest=g.principal.key_digest)
    return rotate_key_schema.dump({"new_key": new_key, "message": ROTATED_MESSAGE})
