"""The ORM session's transactions: owned by the view or CLI command, never by a service."""
from contextlib import contextmanager

from sqlalchemy import delete, select, tuple_

from app import database
from app.errors import Conflict
from app.extensions import db

MAX_ID = 2**31 - 1  # tenant and admin key ids are 32-bit integers in the database


@contextmanager
def unit_of_work():
    """One transaction of the ORM session: committed when the block ends, rolled back when it
    raises. Views and CLI commands open it; the services they call only add and flush."""
    try:
        yield
        db.session.commit()
    except BaseException:
        db.session.info.pop(_AFTER_COMMIT, None)
        db.session.rollback()
        raise
    for callback in db.session.info.pop(_AFTER_COMMIT, ()):
        callback()


_AFTER_COMMIT = "intentgate_after_commit"


def after_commit(callback):
    """Call `callback` once the unit of work in progress commits, never if it rolls back: for
    what must follow a change outside the database (a kept principal forgotten), where done
    before the commit a concurrent request could put back what it read before the change."""
    db.session.info.setdefault(_AFTER_COMMIT, []).append(callback)


def insert_unique(model, values, conflict_text):
    """Insert one `model` row and return it, or raise 409 `conflict_text` when a unique value
    is taken; the owner of the transaction then rolls it back.

    ON CONFLICT DO NOTHING finds the taken value without a failing statement: PostgreSQL logs
    a failed statement with its parameters, and these rows carry a sealed signing secret."""
    statement = (database.current().insert(model).values(**values)
                 .on_conflict_do_nothing().returning(model))
    row = db.session.scalars(statement).first()
    if row is None:
        raise Conflict(conflict_text)
    return row


def delete_batch(key_columns, *conditions, limit):
    """Delete at most `limit` rows matching `conditions`, found by their primary key
    (`key_columns`): a purge in bounded transactions, never one long DELETE of a day's rows.
    The DELETE holds the rows to `conditions` again: a row changed since the SELECT (an
    idempotency record a retry just renewed) no longer matches, and PostgreSQL re-checks the
    whole condition on a row it had to wait for. Returns how many were deleted (0 when none is
    left)."""
    keys = db.session.execute(select(*key_columns).where(*conditions).limit(limit)).all()
    if keys:
        table = key_columns[0].class_.__table__  # Core: nothing in the session to update
        deleted = db.session.execute(delete(table).where(
            tuple_(*key_columns).in_([tuple(key) for key in keys]), *conditions))
        return deleted.rowcount
    return 0
