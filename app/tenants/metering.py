"""Monthly plan limits: the rule, the counting statement, and the 429 that refuses the rest."""
import math
from datetime import datetime, timezone

from sqlalchemy import (BigInteger, String, bindparam, case, cast, func, literal, select,
                        update)

from app import database
from app.errors import TooManyRequests
from app.intents import reasons
from app.tenants.models import DailyUsage, MonthlyUsage, Tenant
from app.tenants.plans import PLAN_LIMITS, monthly_limit

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


# A tenant's counters are rows per shard, summed when read. Concurrent verifications of one
# tenant each add to the row of their own server connection (pg_backend_pid() modulo SHARDS)
# instead of queuing for one row's lock: measured with bench/saturation.py, one tenant's
# generate-and-verify pairs cost PostgreSQL 0.57 ms on one row and 0.47 on sixteen at 8
# clients, 0.79 and 0.42 at 16 (deploy/README: capacity). A limited plan counts its month on
# shard 0 alone: only one row's lock orders the counts exactly enough never to pass the plan.
#
# Every verification counts on its day (daily_usage), and the month's usage_count is the sum
# of its days. monthly_usage holds what is counted against a limited plan: its own counts on
# shard 0 and, on other shards, what the month counted before the tenant moved to a limited
# plan (`fold_statement`; before migration f1a3c5e7b924 every plan counted there too). An
# unlimited plan's verification writes its day's row only: a row less per verify (measured
# with pgbench, 0.02 ms of PostgreSQL CPU at 8 clients, a twentieth of a verify's share).
SHARDS = 16


def _shard():
    """This connection's shard; SQLite writes one transaction at a time, so one row."""
    if database.current().dialect_name == "postgresql":
        return func.mod(func.pg_backend_pid(), SHARDS)
    return literal(0)


def month_total(tenant_id, period, but_shard_0=False):
    """What :period has counted against a limited plan (0 without a row) as a scalar subquery:
    the sum of its monthly_usage shards (all but shard 0 when `but_shard_0`)."""
    usage = MonthlyUsage.__table__.alias("month_shards")
    where = [usage.c.tenant_id == tenant_id, usage.c.period == period]
    if but_shard_0:
        where.append(usage.c.shard != 0)
    return cast(select(func.coalesce(func.sum(usage.c.usage_count), 0)).where(*where)
                .scalar_subquery(), BigInteger)


def usage_count(tenant_id, period):
    """The month's usage_count, every plan's verifications (0 without a row) as a scalar
    subquery: the sum of its days' shards."""
    daily = DailyUsage.__table__
    period = literal(period, String) if isinstance(period, str) else period
    # The month's days, 'YYYY-MM-00' to 'YYYY-MM-31' as text (the day column's): one range of
    # the key (tenant_id, day, shard). Day 00 holds what the month counted before it counted
    # days (migration f1a3c5e7b924); no listing of days shows it.
    return cast(select(func.coalesce(func.sum(daily.c.verifications), 0))
                .where(daily.c.tenant_id == tenant_id, daily.c.day >= period.concat("-00"),
                       daily.c.day <= period.concat("-31"))
                .scalar_subquery(), BigInteger)


# A move to a limited plan and a tenant's verifications exclude each other for a moment, by a
# PostgreSQL advisory lock keyed (PLAN_LOCK, tenant id): each verification holds it shared for
# its transaction, the move exclusively. So the verifications an unlimited plan admitted commit
# before the move counts the month into monthly_usage (`fold_statement`), and one that comes
# during the move waits for it, then counts against the new plan (`plan_limit_now`). Otherwise
# the first counted on their day alone after the fold, and new verifications filled
# monthly_usage up to the limit on top of them (the month past the plan by what was in flight).
PLAN_LOCK = 6782


def plan_lock_statement():
    """Take (:tenant_id)'s plan lock exclusively until the transaction ends; PostgreSQL's only
    (SQLite runs one writing transaction at a time)."""
    return select(func.pg_advisory_xact_lock(literal(PLAN_LOCK), bindparam("tenant_id")))


def plan_limit_now():
    """(:tenant_id)'s monthly limit as its row says now (NULL: unlimited), read inside the
    verification's transaction rather than taken from the principal read before it."""
    tenants = Tenant.__table__
    return select(plan_limit()).where(tenants.c.id == bindparam("tenant_id"))


def plan_limit():
    """The monthly limit of the tenants row in the statement (NULL: unlimited)."""
    tenants = Tenant.__table__
    return case(*((tenants.c.plan == name, literal(value, BigInteger))
                  for name, value in PLAN_LIMITS.items() if value is not None)).label("plan_limit")


def fold_statement():
    """Count against (:tenant_id, :period)'s limited plan what the month counted on its days
    only (an unlimited plan's verifications): the difference between its days and its
    monthly_usage, added to shard 1. Run with the change to a limited plan, after the tenant's
    row is written: its lock orders two changes, and the second sees the first's fold. The
    change holds the tenant's PLAN_LOCK: the verifications the unlimited plan admitted have
    committed, and are folded; those that come meanwhile wait, then count against the plan."""
    usage = MonthlyUsage.__table__
    tenant_id, period = bindparam("tenant_id"), bindparam("period")
    uncounted = usage_count(tenant_id, period) - month_total(tenant_id, period)
    rows = select(tenant_id, period, literal(1), uncounted).where(uncounted > 0)
    statement = database.current().insert(usage).from_select(
        [usage.c.tenant_id, usage.c.period, usage.c.shard, usage.c.usage_count], rows)
    return statement.on_conflict_do_update(
        index_elements=[usage.c.tenant_id, usage.c.period, usage.c.shard],
        set_={"usage_count": usage.c.usage_count + statement.excluded.usage_count})


def count_within_plan_statement():
    """Count one verification for (:tenant_id, :period) in one statement that never passes
    :plan_limit: on shard 0, whose row lock orders the counts, against the sum of every shard
    (what the month counted before the move to this plan included: `fold_statement`). It
    returns the month's new count against the plan, or no row when the plan is used up."""
    plan_limit = bindparam("plan_limit", type_=BigInteger)
    usage = MonthlyUsage.__table__
    counted_elsewhere = month_total(bindparam("tenant_id"), bindparam("period"),
                                    but_shard_0=True)
    first = select(bindparam("tenant_id"), bindparam("period"), literal(0), literal(1)).where(
        within_plan(counted_elsewhere, plan_limit))
    return (
        database.current().insert(usage)
        .from_select([usage.c.tenant_id, usage.c.period, usage.c.shard, usage.c.usage_count],
                     first)
        .on_conflict_do_update(
            index_elements=[usage.c.tenant_id, usage.c.period, usage.c.shard],
            set_={"usage_count": usage.c.usage_count + 1},
            where=within_plan(usage.c.usage_count + counted_elsewhere, plan_limit),
        )
        .returning((usage.c.usage_count + counted_elsewhere).label("usage_count"))
    )


# Each block reason's column in daily_usage.
REASON_COLUMNS = {
    reasons.UNKNOWN: "unknown_intent", reasons.EXPIRED: "expired_intent",
    reasons.REPLAYED_INTENT: "replayed_intent", reasons.INVALID_SIGNATURE: "invalid_signature",
    reasons.OUT_OF_WINDOW: "timestamp_out_of_window",
    reasons.REPLAYED_RESPONSE: "replayed_response",
}


def _outcome_counts():
    """One verification with its outcome (:reason, NULL when cleared), as daily_usage's
    columns."""
    reason = bindparam("reason", type_=String)
    outcomes = {"verifications": literal(1),
                "cleared": case((reason.is_(None), 1), else_=0)}
    outcomes.update({column: case((reason == literal(name), 1), else_=0)
                     for name, column in REASON_COLUMNS.items()})
    return outcomes


def add_to_day_statement():
    """Count one verification with its outcome on (:tenant_id, :day)'s row of this
    connection's shard, if the row is there (no row changed: the day's first on the shard,
    which `count_daily_statement` counts). A plain UPDATE: the upsert's ON CONFLICT DO UPDATE
    probes the key's index before it finds the row and locks the row before it updates it,
    one more WAL record per verification (migration a1c3e5f7b902)."""
    daily = DailyUsage.__table__
    return _add_to_day(daily, {column: daily.c[column] + count
                               for column, count in _outcome_counts().items()})


def add_cleared_to_day_statement():
    """`add_to_day_statement` for a cleared verification, the most frequent outcome: two
    columns written where the other sets all eight through CASEs, whose expressions PostgreSQL
    sets up at each run (callgrind: 35,400 fewer instructions per verify)."""
    daily = DailyUsage.__table__
    return _add_to_day(daily, {"verifications": daily.c.verifications + 1,
                               "cleared": daily.c.cleared + 1})


def _add_to_day(daily, values):
    return (update(daily)
            .where(daily.c.tenant_id == bindparam("tenant_id"), daily.c.day == bindparam("day"),
                   daily.c.shard == _shard())
            .values(values))


def count_daily_statement():
    """Count one verification with its outcome (:reason, NULL when cleared) for
    (:tenant_id, :day), on the shard of this connection, inserting the row if it is not
    there."""
    daily = DailyUsage.__table__
    outcomes = _outcome_counts()
    statement = database.current().insert(daily).inline().values(
        tenant_id=bindparam("tenant_id"), day=bindparam("day"), shard=_shard(), **outcomes)
    return statement.on_conflict_do_update(
        index_elements=[daily.c.tenant_id, daily.c.day, daily.c.shard],
        set_={column: daily.c[column] + statement.excluded[column] for column in outcomes})


def refuse_over_limit():
    raise TooManyRequests(LIMIT_REACHED, retry_after=_seconds_to_next_month())


def _seconds_to_next_month():
    """Whole seconds until the month turns, rounded up: in the month's last second it is 1,
    not 0 (a retry at once would meet the same 429)."""
    now = datetime.now(timezone.utc)
    first_next = (datetime(now.year + 1, 1, 1, tzinfo=timezone.utc) if now.month == 12
                  else datetime(now.year, now.month + 1, 1, tzinfo=timezone.utc))
    return math.ceil((first_next - now).total_seconds())
