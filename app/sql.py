"""The ORM session's transactions: owned by the view or CLI command, never by a service."""
from contextlib import contextmanager

from sqlalchemy.exc import IntegrityError

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
        db.session.rollback()
        raise


def insert_unique(instance, conflict_text):
    """Add and flush `instance` (it gets its id), or raise 409 `conflict_text` if a unique value
    is taken; the owner of the transaction then rolls it back."""
    db.session.add(instance)
    try:
        db.session.flush()
    except IntegrityError:
        raise Conflict(conflict_text) from None
    return instance
