"""Time in one place, so billing periods and expiries agree and tests can travel in time."""
import math
import time
from datetime import datetime, timezone


def now_seconds():
    return int(time.time())


def expiry(expires_in):
    """The Unix second from which something asked to last `expires_in` seconds stops: counted
    from the exact time (not the truncated second, which cut up to a second off) and rounded
    up, so it never stops before the time asked. None when there is no expiry."""
    return None if expires_in is None else math.ceil(time.time() + expires_in)


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
