"""The plans of SPEC.md: monthly verification limits (None is unlimited)."""
PLAN_LIMITS = {
    "free": 1_000,
    "starter": 50_000,
    "pro": 500_000,
    "enterprise": None,
}
PLANS = tuple(PLAN_LIMITS)
PAID_PLANS = ("starter", "pro", "enterprise")
SIGNATURE_SCHEMES = ("bound", "payload", "ed25519")


def monthly_limit(plan):
    return PLAN_LIMITS[plan]
