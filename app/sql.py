"""Dialect-aware statements: the upserts we rely on exist in PostgreSQL and SQLite alike."""
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.extensions import db


def upsert_insert(model):
    """An INSERT that supports .on_conflict_do_nothing() / .on_conflict_do_update()."""
    if db.session.get_bind().dialect.name == "postgresql":
        return postgresql_insert(model)
    return sqlite_insert(model)
