"""Public health check: the database and the rate-limit store must both answer."""
from flask import current_app, g
from marshmallow import Schema, fields
from sqlalchemy import literal, select

from app import database
from app.errors import Unavailable
from app.keyring import checks as key_checks
from app.openapi import Blueprint
from app.traffic import limits

bp = Blueprint("health", __name__)


class HealthSchema(Schema):
    status = fields.String(required=True, metadata={"enum": ["ok", "unavailable"]})
    checks = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    error = fields.String()
    request_id = fields.String()


def _database_ok():
    try:
        database.execute("health", lambda: select(literal(1)), {})
        return True
    except Unavailable:
        return False


def _secret_keys_ok():
    """The key ring against the database's record of the keys that sealed its secrets, as the
    start found it; when the start could not check it (the database did not answer then),
    checked once it does, here, where a ring that would have stopped the start is seen."""
    extensions = current_app.extensions
    if extensions.get("secret_keys") == key_checks.DEFERRED:
        extensions["secret_keys"] = key_checks.check_deferred(current_app.config)
    return extensions.get("secret_keys") != key_checks.MISMATCHED


@bp.get("/health")
@bp.response(200, HealthSchema)
@bp.alt_response(503, schema=HealthSchema,
                 description="The database or the rate-limit store is down (the failing check "
                             "says which), or `secret_keys`: the key ring cannot unseal the "
                             "database's secrets, found after a start that could not check it "
                             "or by a worker started or reloaded while another process seals "
                             "with a key this ring lacks; in the error envelope.")
def health():
    """Health of the database and the rate-limit store"""
    checks = {
        "database": "ok" if _database_ok() else "unavailable",
        "rate_limit_store": "ok" if limits.store_available() else "unavailable",
    }
    if checks["database"] == "ok" and not _secret_keys_ok():
        checks["secret_keys"] = key_checks.MISMATCHED
    healthy = all(state == "ok" for state in checks.values())
    if healthy:
        return {"status": "ok", "checks": checks}
    # Still the error envelope of every 5xx, with the checks that failed, and the Retry-After
    # every other 503 of the service carries.
    return {"status": "unavailable", "checks": checks, "error": "service unavailable",
            "request_id": g.get("request_id")}, 503, {"Retry-After": "1"}
