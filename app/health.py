"""Public health check: the database and the rate-limit store must both answer."""
import logging

from flask import current_app, g
from marshmallow import Schema, fields

from app import database
from app.errors import Unavailable
from app.keyring import checks as key_checks
from app.openapi import Blueprint
from app.traffic import limits

log = logging.getLogger(__name__)
bp = Blueprint("health", __name__)


class HealthSchema(Schema):
    status = fields.String(required=True, metadata={"enum": ["ok", "unavailable"]})
    checks = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    error = fields.String()
    request_id = fields.String()


def _recorded_keys():
    """The check values the database records, or None when it does not answer."""
    try:
        return {row.check_value for row in database.execute("health", key_checks.sealing_keys, {})}
    except Unavailable:
        return None
    except database.current().dbapi.ProgrammingError:
        return set()  # PostgreSQL not migrated yet (no such table): nothing recorded


def _secret_keys_ok(recorded):
    """The key ring against the database's record of the keys that sealed its secrets (the
    `recorded` check values), as the record is now: another process, its ring changed before
    this one's, may have grown it with a key this ring lacks since it started (its tenants then
    get 503s from this process, and /health said 200); and a reseal may have brought it back
    within this ring (healthy again: the ring unseals every secret, and a restart would pass).
    When the start could not check the ring (the database did not answer then), it is checked
    once the database does, here, where a ring that would have stopped the start is seen. A
    database that records nothing (not migrated this far) is judged as the start judged it.
    Each change of verdict is said once."""
    extensions, config = current_app.extensions, current_app.config
    if extensions.get("secret_keys") == key_checks.DEFERRED:
        extensions["secret_keys"] = key_checks.check_deferred(config)
    was = extensions.get("secret_keys")
    if not recorded:
        return was != key_checks.MISMATCHED
    if key_checks.ring_holds(recorded, config):
        if was == key_checks.MISMATCHED:
            log.warning("SECRET_ENCRYPTION_KEY holds every key the database records again")
        extensions["secret_keys"] = key_checks.CHECKED
        return True
    if was != key_checks.MISMATCHED:
        extensions["secret_keys"] = key_checks.MISMATCHED
        log.error("%s; found by /health: another process seals with it since this one started",
                  key_checks.mismatch(config))
    return False


@bp.get("/health")
@bp.response(200, HealthSchema)
@bp.alt_response(503, schema=HealthSchema,
                 description="The database or the rate-limit store is down (the failing check "
                             "says which), or `secret_keys`: the key ring cannot unseal the "
                             "database's secrets: another process seals with a key this ring "
                             "lacks; in the error envelope.")
def health():
    """Health of the database and the rate-limit store"""
    recorded = _recorded_keys()
    checks = {
        "database": "unavailable" if recorded is None else "ok",
        "rate_limit_store": "ok" if limits.store_available() else "unavailable",
    }
    if recorded is not None and not _secret_keys_ok(recorded):
        checks["secret_keys"] = key_checks.MISMATCHED
    healthy = all(state == "ok" for state in checks.values())
    if healthy:
        return {"status": "ok", "checks": checks}
    # Still the error envelope of every 5xx, with the checks that failed, and the Retry-After
    # every other 503 of the service carries.
    return {"status": "unavailable", "checks": checks, "error": "service unavailable",
            "request_id": g.get("request_id")}, 503, {"Retry-After": "1"}
