"""Admin key operations, shared by the CLI (and any internal tooling)."""
import logging
from dataclasses import dataclass

from sqlalchemy import select

from app import crypto
from app.admin.models import AdminKey
from app.clock import utcnow
from app.errors import NotFound
from app.extensions import db
from app.sql import add_unique

log = logging.getLogger(__name__)


@dataclass
class IssuedAdminKey:
    admin_key: AdminKey
    api_key: str
    signing_secret: str


def create_admin_key(name):
    api_key = crypto.new_api_key()
    signing_secret = crypto.new_signing_secret()
    admin_key = AdminKey(
        name=name,
        key_digest=crypto.key_digest(api_key),
        key_prefix=crypto.display_prefix(api_key),
        signing_secret_sealed=crypto.seal(signing_secret),
        active=True,
    )
    add_unique(admin_key, "an admin key with this name already exists")
    log.info("admin key created", extra={"admin_key_id": admin_key.id})
    return IssuedAdminKey(admin_key, api_key, signing_secret)


def list_admin_keys():
    return db.session.execute(select(AdminKey).order_by(AdminKey.id)).scalars().all()


def revoke_admin_key(reference):
    reference = str(reference).strip()
    condition = (AdminKey.id == int(reference)) if reference.isdigit() else (AdminKey.name == reference)
    admin_key = db.session.execute(select(AdminKey).where(condition)).scalar_one_or_none()
    if admin_key is None:
        raise NotFound("admin key not found")
    admin_key.active = False
    admin_key.revoked_at = utcnow()
    db.session.commit()
    log.info("admin key revoked", extra={"admin_key_id": admin_key.id})
    return admin_key
