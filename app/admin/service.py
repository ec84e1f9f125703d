"""Admin key operations, shared by the CLI (and any internal tooling)."""
import logging
from dataclasses import dataclass

from sqlalchemy import bindparam, select

from app import crypto, database
from app.admin.models import AdminKey
from app.clock import utcnow
from app.errors import BadRequest, NotFound
from app.extensions import db
from app.sql import MAX_ID, insert_unique

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 100  # the column's length


@dataclass
class IssuedAdminKey:
    admin_key: AdminKey
    api_key: str
    signing_secret: str


def _checked_name(name):
    """Return the trimmed name, or raise 400: a person tells keys apart by name, so a name is
    never blank and never all digits (revoke takes ids, and "3" must not mean two keys)."""
    name = name.strip()
    if not name:
        raise BadRequest("admin key name must not be blank")
    if len(name) > MAX_NAME_LENGTH:
        raise BadRequest(f"admin key name must be at most {MAX_NAME_LENGTH} characters")
    if name.isdigit():
        raise BadRequest("admin key name must not be all digits: ids are numbers")
    if not name.isprintable():
        raise BadRequest("admin key name must not contain control characters")
    return name


def create_admin_key(name):
    name = _checked_name(name)
    api_key = crypto.new_api_key()
    signing_secret = crypto.new_signing_secret()
    admin_key = insert_unique(AdminKey, {
        "name": name,
        "key_digest": crypto.key_digest(api_key),
        "key_prefix": crypto.display_prefix(api_key),
        "signing_secret_sealed": crypto.seal(signing_secret),
        "active": True,
    }, "an admin key with this name already exists")
    log.info("admin key created", extra={"admin_key_id": admin_key.id})
    return IssuedAdminKey(admin_key, api_key, signing_secret)


def _active_by_key_digest():
    admin_keys = AdminKey.__table__
    return select(admin_keys).where(admin_keys.c.key_digest == bindparam("digest"),
                                    admin_keys.c.active.is_(True))


def find_by_key_digest(digest):
    """The active admin key row with this digest, or None (request path)."""
    admin_key = database.first("admin_key_by_digest", _active_by_key_digest, {"digest": digest})
    if admin_key is None or not crypto.digests_match(admin_key.key_digest, digest):
        return None
    return admin_key


def list_admin_keys():
    return db.session.execute(select(AdminKey).order_by(AdminKey.id)).scalars().all()


def revoke_admin_key(admin_key_id=None, name=None):
    """Revoke the admin key with this id, or else the one with this name."""
    if name is not None:
        condition = AdminKey.name == name.strip()
    elif 0 < admin_key_id <= MAX_ID:
        condition = AdminKey.id == admin_key_id
    else:
        raise NotFound("admin key not found")
    admin_key = db.session.execute(select(AdminKey).where(condition)).scalar_one_or_none()
    if admin_key is None:
        raise NotFound("admin key not found")
    if admin_key.active:  # revoked again: when it was first revoked stays recorded
        admin_key.active = False
        admin_key.revoked_at = utcnow()
        db.session.flush()
        log.info("admin key revoked", extra={"admin_key_id": admin_key.id})
    return admin_key
