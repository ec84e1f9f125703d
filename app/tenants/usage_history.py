"""Daily usage by outcome: the rows the gate counts, as days with zeros where nothing ran."""
from datetime import datetime, timedelta, timezone

from sqlalchemy import BigInteger, cast, func, select

from app.clock import utc_day
from app.extensions import db
from app.tenants.metering import REASON_COLUMNS
from app.tenants.tenant_row import existing_tenant
from app.tenants.models import DailyUsage

MAX_DAYS = 92
COUNTS = ("verifications", "cleared", *REASON_COLUMNS.values())


def daily(tenant_id, days):
    """The last `days` UTC days, today included, oldest first."""
    existing_tenant(tenant_id)
    today = datetime.now(timezone.utc)
    dates = [utc_day(today - timedelta(days=back)) for back in range(days - 1, -1, -1)]
    totals = (cast(func.sum(getattr(DailyUsage, column)), BigInteger).label(column)
              for column in COUNTS)
    rows = {row.day: row for row in db.session.execute(
        select(DailyUsage.day, *totals)
        .where(DailyUsage.tenant_id == tenant_id,
               DailyUsage.day >= dates[0], DailyUsage.day <= dates[-1])
        .group_by(DailyUsage.day))}  # a day is the sum of its shards
    return [_day(date, rows.get(date)) for date in dates]


def _day(date, row):
    return {
        "date": date,
        "verifications": row.verifications if row else 0,
        "cleared": row.cleared if row else 0,
        "blocked": {reason: getattr(row, column) if row else 0
                    for reason, column in REASON_COLUMNS.items()},
    }
