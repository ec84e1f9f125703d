"""Monthly plan limits: what a tenant may still use this billing period."""
from app.errors import TooManyRequests
from app.tenants.plans import monthly_limit

LIMIT_REACHED = "monthly verification limit reached"


def ensure_within_plan(principal):
    """Refuse with 429 when the tenant's verifications this month have reached its plan."""
    if principal.kind != "tenant":
        return  # admin keys are unmetered
    limit = monthly_limit(principal.tenant.plan)
    if limit is not None and principal.usage_count >= limit:
        raise TooManyRequests(LIMIT_REACHED, retry_after=_seconds_to_next_month())


def _seconds_to_next_month():
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    first_next = (datetime(now.year + 1, 1, 1, tzinfo=timezone.utc) if now.month == 12
                  else datetime(now.year, now.month + 1, 1, tzinfo=timezone.utc))
    return int((first_next - now).total_seconds())
