"""What an API key may do (CONTRACT.md, Authentication, "Scopes"): least privilege, so the key a
backend holds to generate and verify cannot mint signing power.

A key's scopes are stored as one space-separated string in their canonical order; a tenant's
first key and keys that predate scopes hold all of them. Admin keys are operators: they hold
every scope and are never asked for one.
"""
from app.errors import Forbidden

INTENTS = "intents"
USAGE_READ = "usage:read"
KEYS_WRITE = "keys:write"
SIGNING_WRITE = "signing:write"
WEBHOOKS_WRITE = "webhooks:write"

SCOPES = (INTENTS, USAGE_READ, KEYS_WRITE, SIGNING_WRITE, WEBHOOKS_WRITE)
ALL = frozenset(SCOPES)
# What a key made without naming its scopes holds: a backend's generate and verify.
DEFAULT = frozenset({INTENTS})
# As stored for a key holding every scope (a tenant's first key; the migration's backfill).
ALL_STORED = " ".join(SCOPES)

WHAT_EACH_GRANTS = {
    INTENTS: "generate and verify",
    USAGE_READ: "daily usage, the audit log, and the listings of API keys, signing keys and "
                "webhooks",
    KEYS_WRITE: "create and revoke API keys",
    SIGNING_WRITE: "rotate the signing secret, manage signing keys, set the signature scheme",
    WEBHOOKS_WRITE: "manage webhook endpoints and usage alerts",
}

CANNOT_GRANT = "a key cannot grant scopes it does not hold"


def stored(scopes):
    """The column's form: canonical order, no duplicates."""
    return " ".join(scope for scope in SCOPES if scope in scopes)


def listed(stored_scopes):
    """The listing's form: a list in canonical order."""
    return [scope for scope in SCOPES if scope in (stored_scopes or "").split()]


def held(stored_scopes):
    return frozenset((stored_scopes or "").split())


def require(scopes, scope):
    """Raise the contract's 403 unless `scopes` hold `scope`."""
    if scope not in scopes:
        raise Forbidden(f"this key lacks the scope {scope}")


def grantable(requested, granting):
    """A key never holds more than the key that makes it; `granting` None is an operator."""
    if granting is not None and not requested <= granting:
        raise Forbidden(CANNOT_GRANT)
    return requested
