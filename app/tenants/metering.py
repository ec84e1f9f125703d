"""Monthly plan limits: counting verifications and refusing what the plan does not cover."""
from datetime import datetime, timezone

from app.clock import billing_period
from app.errors import TooManyRequests
from app.extensions import db
from app.sql import upsert_insert
from app.tenants.models import MonthlyUsage
from app.tenants.plans import monthly_limit

LIMIT_REACHED = "monthly verification limit reached"


def ensure_within_plan(principal):
    """Refuse with 429 when the tenant's verifications this month have reached its plan."""
    if principal.kind != "tenant":
        return  # admin keys are unmetered
    limit = monthly_limit(principal.tenant.plan)
    if limit is not None and principal.usage_count >= limit:
        refuse_over_limit()


def count_verification(principal):
    """Add one verification to this month's counter in one statement that never passes the
    plan limit; raise 429 when the limit is already reached (the caller's transaction is then
    rolled back, so nothing of the verify is kept)."""
    if principal.kind != "tenant":
        return
    limit = monthly_limit(principal.tenant.plan)
    usage = MonthlyUsage.__table__
    statement = upsert_insert(usage).values(
        tenant_id=principal.id, period=billing_period(), usage_count=1
    )
    statement = statement.on_conflict_do_update(
        index_elements=[usage.c.tenant_id, usage.c.period],
        set_={"usage_count": usage.c.usage_count + 1},
        where=None if limit is None else usage.c.usage_count < limit,
    ).returning(usage.c.usage_count)
    if db.session.execute(statement).scalar() is None:
        refuse_over_limit()


def refuse_over_limit():
    raise TooManyRequests(LIMIT_REACHED, retry_after=_seconds_to_next_month())


def _seconds_to_next_month():
    now = datetime.now(timezone.utc)
    first_next = (datetime(now.year + 1, 1, 1, tzinfo=timezone.utc) if now.month == 12
                  else datetime(now.year, now.month + 1, 1, tzinfo=timezone.utc))
    return int((first_next - now).total_seconds())
