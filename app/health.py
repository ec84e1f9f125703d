"""Public health check: the database and the rate-limit store must both answer."""
from flask import Blueprint, g
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.extensions import db
from app.traffic import bucket

bp = Blueprint("health", __name__)


def _database_ok():
    try:
        db.session.execute(text("SELECT 1"))
        return True
    except SQLAlchemyError:
        db.session.rollback()
        return False


@bp.get("/health")
def health():
    checks = {
        "database": "ok" if _database_ok() else "unavailable",
        "rate_limit_store": "ok" if bucket.store_available() else "unavailable",
    }
    healthy = all(state == "ok" for state in checks.values())
    if healthy:
        return {"status": "ok", "checks": checks}
    # Still the error envelope of every 5xx, with the checks that failed.
    return {"status": "unavailable", "checks": checks, "error": "service unavailable",
            "request_id": g.get("request_id")}, 503
