"""Monthly plan limits: the rule, the counting statement, and the 429 that refuses the rest."""
from datetime import datetime, timezone

from sqlalchemy import BigInteger, String, bindparam, case, literal, or_

from app import database
from app.errors import TooManyRequests
from app.intents import reasons
from app.tenants.models import DailyUsage, MonthlyUsage
from app.tenants.plans import monthly_limit

LIMIT_REACHED = "monthly verification limit reached"


def within_plan(usage_count, limit):
    """The plan rule: one more verification fits. `usage_count` is a number or a SQL column."""
    return usage_count < limit


def refuse_if_over_plan(principal):
    """429 when a tenant's verifications this month have reached its plan (admins: unmetered)."""
    if principal.kind != "tenant":
        return
    limit = monthly_limit(principal.tenant.plan)
    if limit is not None and not within_plan(principal.usage_count, limit):
        refuse_over_limit()


def count_statement():
    """Count one verification for (:tenant_id, :period), in one statement that never passes
    :plan_limit (NULL: unlimited); it returns the new usage_count, or no row when the plan is
    used up."""
    plan_limit = bindparam("plan_limit", type_=BigInteger)
    usage = MonthlyUsage.__table__
    return (
        database.current().insert(usage)
        .values(tenant_id=bindparam("tenant_id"), period=bindparam("period"), usage_count=1)
        .on_conflict_do_update(
            index_elements=[usage.c.tenant_id, usage.c.period],
            set_={"usage_count": usage.c.usage_count + 1},
            where=or_(plan_limit.is_(None), within_plan(usage.c.usage_count, plan_limit)),
        )
        .returning(usage.c.usage_count)
    )


# Each block reason's column in daily_usage.
REASON_COLUMNS = {
    reasons.UNKNOWN: "unknown_intent", reasons.EXPIRED: "expired_intent",
    reasons.REPLAYED_INTENT: "replayed_intent", reasons.INVALID_SIGNATURE: "invalid_signature",
    reasons.OUT_OF_WINDOW: "timestamp_out_of_window",
    reasons.REPLAYED_RESPONSE: "replayed_response",
}


def count_daily_statement():
    """Count one verification with its outcome (:reason, NULL when cleared) for
    (:tenant_id, :day)."""
    daily = DailyUsage.__table__
    reason = bindparam("reason", type_=String)
    outcomes = {"verifications": literal(1),
                "cleared": case((reason.is_(None), 1), else_=0)}
    outcomes.update({column: case((reason == literal(name), 1), else_=0)
                     for name, column in REASON_COLUMNS.items()})
    statement = database.current().insert(daily).values(
        tenant_id=bindparam("tenant_id"), day=bindparam("day"), **outcomes)
    return statement.on_conflict_do_update(
        index_elements=[daily.c.tenant_id, daily.c.day],
        set_={column: daily.c[column] + statement.excluded[column] for column in outcomes})


def refuse_over_limit():
    raise TooManyRequests(LIMIT_REACHED, retry_after=_seconds_to_next_month())


def _seconds_to_next_month():
    now = datetime.now(timezone.utc)
    first_next = (datetime(now.year + 1, 1, 1, tzinfo=timezone.utc) if now.month == 12
                  else datetime(now.year, now.month + 1, 1, tzinfo=timezone.utc))
    return int((first_next - now).total_seconds())
