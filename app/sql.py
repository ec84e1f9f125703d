"""Dialect-aware statements: the upserts we rely on exist in PostgreSQL and SQLite alike."""
from functools import wraps

from flask import request
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


def single_statement(unless_header):
    """For a view whose database work is one self-contained statement (after read-only
    lookups): on PostgreSQL run the request in autocommit, saving the BEGIN and COMMIT round
    trips. A request carrying `unless_header` keeps an ordinary transaction."""

    def decorator(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            # A session already inside a transaction (an app context that outlives the request,
            # as in tests) keeps it: the statement then commits with the view's commit.
            if unless_header not in request.headers and not db.session().in_transaction() \
                    and db.session.get_bind().dialect.name == "postgresql":
                db.session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            return view(*args, **kwargs)

        return wrapper

    return decorator
