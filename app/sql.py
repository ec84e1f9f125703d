"""Dialect-aware statements: the upserts we rely on exist in PostgreSQL and SQLite alike."""
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict
from app.extensions import db


def upsert_insert(model):
    """An INSERT that supports .on_conflict_do_nothing() / .on_conflict_do_update()."""
    if db.session.get_bind().dialect.name == "postgresql":
        return postgresql_insert(model)
    return sqlite_insert(model)


def add_unique(instance, conflict_text):
    """Insert and commit `instance`, or raise 409 `conflict_text` if a unique value is taken."""
    db.session.add(instance)
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise Conflict(conflict_text) from None
    return instance
