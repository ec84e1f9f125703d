"""The key check values: checked at start, by `flask db upgrade` and before every seal."""
import logging
import os

from cryptography.fernet import InvalidToken
from flask import current_app
from sqlalchemy import create_engine, delete, inspect, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.pool import NullPool

from app import master_files
from app.admin.models import AdminKey
from app.clock import now_seconds
from app.config import KeyRingMismatch
from app.errors import database_failure
from app.extensions import db
from app.keyring import ring
from app.keyring.models import SecretKeyCheck
from app.tenants.models import Tenant
from app.webhooks.models import WebhookEndpoint

log = logging.getLogger(__name__)

# Every column that holds a sealed secret: reseal walks them all, the first check samples them.
SEALED_COLUMNS = ((Tenant, ("signing_secret_sealed", "previous_signing_secret_sealed")),
                  (AdminKey, ("signing_secret_sealed",)),
                  (WebhookEndpoint, ("secret_sealed", "previous_secret_sealed")))
# How many of the newest secrets of each table a database without check values is judged by.
SAMPLE = 20
MISMATCH = ("SECRET_ENCRYPTION_KEY cannot unseal the secrets in this database: a key that sealed "
            "them is not in the ring (after a new first key, keep the old one until "
            "`flask --app wsgi secrets reseal` has run)")
# What the start check found, kept by create_app in app.extensions["secret_keys"].
CHECKED, DEFERRED, MISMATCHED = "ok", "deferred", "mismatch"
LOCAL_KEY = ("; SECRET_ENCRYPTION_KEY is not set, so this is local mode's own key "
             "(instance/secret-encryption.key)")


def mismatch(config):
    return KeyRingMismatch(MISMATCH + (LOCAL_KEY if config.get("LOCAL_ENCRYPTION_KEY") else ""))


def check_at_start(config):
    """The check of create_app and of gunicorn's master: one or two small queries, on a
    connection of its own (nothing stays pooled to be inherited by forked workers). A database
    that cannot be reached now is checked before each seal, and by /health once it answers
    (check_deferred). Returns DEFERRED then, MISMATCHED for a ring a running master's worker
    finds wanting (it is said, below, and the worker serves on), else CHECKED."""
    try:
        return _check(config)
    except KeyRingMismatch as exc:
        # Once gunicorn's master has started (so also in every worker it forks), it checked the
        # ring before the first worker. A worker it starts later (recycled after max_requests),
        # or the master re-reading its settings on a reload (SIGHUP), while another process
        # already seals with a key this one lacks must not stop the master, and every worker
        # with it: it says so, and the tenants whose secrets it cannot unseal are answered 503
        # until this process's ring holds the key. /health says so too, as after a start that
        # found the database down: the same ring, the same answer, whichever found it.
        if not master_files.master_running():
            raise
        log.error("%s; this worker goes on: secrets sealed with that key answer 503", exc)
        return MISMATCHED


def check_deferred(config):
    """The start check, run once the database answers after a start that found it down
    (app.health): CHECKED, DEFERRED while it still does not answer, or MISMATCHED, said in the
    start's words. Such a ring would have stopped the start: the process serves on (a 503 for
    each secret it cannot unseal) but is no longer healthy, so that it is seen."""
    try:
        return _check(config)
    except KeyRingMismatch as exc:
        log.error("%s; found once the database answered after the start", exc)
        return MISMATCHED


def _check(config):
    url = make_url(config["SQLALCHEMY_DATABASE_URI"])
    sqlite = url.get_backend_name() == "sqlite"
    if sqlite and not os.path.exists(url.database or ""):
        return CHECKED  # no file, no secrets (and connecting would create the file)
    engine = create_engine(url, poolclass=NullPool,
                           connect_args={"timeout": 30} if sqlite else {"connect_timeout": 5})
    try:
        with engine.connect() as connection:
            verify(connection, config)
            connection.commit()
        return CHECKED
    except (OperationalError, InterfaceError) as exc:
        log.warning("secret key check deferred: database unavailable",
                    extra=database_failure(exc, url))
        return DEFERRED
    finally:
        engine.dispose()


def verify(connection, config):
    """Refuse a ring that lacks a key recorded in this database (KeyRingMismatch), or, in a
    database not migrated this far yet, a ring of which no key unseals its newest secrets."""
    tables = inspect(connection)
    if tables.has_table(SecretKeyCheck.__tablename__):
        _verified(connection, config)
    elif tables.has_table(Tenant.__tablename__) and tables.has_table(AdminKey.__tablename__):
        if _unsealing_keys(connection, config["SECRET_ENCRYPTION_KEY"]) == set():
            raise mismatch(config)


def record_sealing_key():
    """Before a secret is sealed: verify the ring (the start check may have found the database
    down) and record the sealing key, in the caller's transaction."""
    if not _table_exists():
        return
    connection = db.session.connection()
    config = current_app.config
    sealing_key = ring.check_values(config["SECRET_ENCRYPTION_KEY"])[0]
    if sealing_key not in _verified(connection, config):
        _record(connection, sealing_key)


def keep_only_sealing_key():
    """After every secret was re-sealed with the first key: forget the other keys."""
    sealing_key = ring.check_values(current_app.config["SECRET_ENCRYPTION_KEY"])[0]
    db.session.execute(delete(SecretKeyCheck).where(SecretKeyCheck.check_value != sealing_key))
    _record(db.session.connection(), sealing_key)


def _verified(connection, config):
    """The recorded check values, all of them keys of the ring. A database with secrets but no
    check value (made before them, or never checked) gets those of the ring's keys that
    unseal some of its newest secrets; if none does, the ring is wrong."""
    ring_text = config["SECRET_ENCRYPTION_KEY"]
    recorded = set(connection.scalars(sealing_keys()))
    if recorded:
        if not ring_holds(recorded, config):
            raise mismatch(config)
        return recorded
    recorded = _unsealing_keys(connection, ring_text)
    if recorded is None:
        return set()  # nothing sealed yet: the first seal records its key
    if not recorded:
        raise mismatch(config)
    for value in recorded:
        _record(connection, value)
    return recorded


def sealing_keys():
    """The database's record of the keys that sealed its secrets (their check values): read by
    the start's check and by /health."""
    return select(SecretKeyCheck.check_value)


def ring_holds(recorded, config):
    """Whether the ring holds every key of `recorded`, the database's check values."""
    return recorded <= set(ring.check_values(config["SECRET_ENCRYPTION_KEY"]))


def _unsealing_keys(connection, ring_text):
    """The check values of the ring's keys that unseal some of the newest stored secrets;
    None when nothing is stored."""
    tables = inspect(connection)  # a database not migrated this far may lack some of them
    tokens = [token for model, columns in SEALED_COLUMNS
              if tables.has_table(model.__tablename__) for token in connection.scalars(
                  select(getattr(model, columns[0])).order_by(model.id.desc()).limit(SAMPLE))]
    if not tokens:
        return None
    return {ring.check_value(key) for key in ring.keys(ring_text)
            if any(_unseals(key, token) for token in tokens)}


def _unseals(key, token):
    try:
        ring.fernet(key).decrypt(token.encode("ascii"))
        return True
    except InvalidToken:
        return False


def _record(connection, value):
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite_insert
    connection.execute(insert(SecretKeyCheck).values(check_value=value, recorded_at=now_seconds())
                       .on_conflict_do_nothing())


def _table_exists():
    # Once made, the table stays: asked until then only (a database not yet migrated).
    if not current_app.extensions.get("secret_key_checks"):
        current_app.extensions["secret_key_checks"] = inspect(
            db.session.connection()).has_table(SecretKeyCheck.__tablename__)
    return current_app.extensions["secret_key_checks"]
