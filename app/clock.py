"""Time in one place, so billing periods and expiries agree and tests can travel in time."""
import time
from datetime import datetime, timezone


def now_seconds():
    return int(time.time())


def utcnow():
    return datetime.now(timezone.utc).replace(tzinfo=None)


def utc_day(at=None):
    """The calendar day in UTC, as 'YYYY-MM-DD' (daily usage)."""
    moment = at or datetime.now(timezone.utc)
    return f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"


def billing_period(at=None):
    """The calendar month in UTC, as 'YYYY-MM'."""
    moment = at or datetime.now(timezone.utc)
    return f"{moment.year:04d}-{moment.month:02d}"
