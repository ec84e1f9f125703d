"""Tenant self-service for one tenant (CONTRACT.md, Tenant self-service): the tenant API serves
it for the caller, the admin API for any tenant, with the same fields and answers. Each change
is one transaction, owned here; the logic is the services', shared with the CLI."""
from app.errors import Forbidden
from app.schemas import Extended
from app.sql import unit_of_work
from app.tenants import audit, keys, service, signing, usage_history

KEY_NOT_FOUND = "`API key not found`."
KEY_CONFLICT = ("`a tenant holds at most 10 active API keys: revoke one first`, or `this is the "
                "tenant's last active API key: create another one first`.")
SIGNING_KEY_CONFLICT = ("`a tenant holds at most 5 active signing keys: revoke one first`, or "
                        "`this is the last active signing key of a tenant on the ed25519 "
                        "scheme`.")
SCHEME_CONFLICT = "`the ed25519 scheme needs an active signing key: add one first`."
# One HMAC of a payload alone clears any number of intents and match_ids: the operator decides
# that an AI service may sign so little, never a key that may have leaked from a backend.
PAYLOAD_BY_OPERATOR = "the payload scheme can only be chosen by an operator"


def list_api_keys(tenant_id):
    return {"keys": keys.list_keys(tenant_id)}


def create_api_key(tenant_id, fields, principal):
    """A key never holds more than the key that makes it; an operator grants any scope."""
    granting = None if principal.operator else principal.scopes
    with unit_of_work():
        row, api_key = keys.create_key(tenant_id, granting=granting, **fields)
    return Extended(row, api_key=api_key)


def revoke_api_key(tenant_id, key_id):
    with unit_of_work():
        return keys.revoke_key(tenant_id, key_id)


def list_signing_keys(tenant_id):
    return {"signing_keys": signing.list_signing_keys(tenant_id)}


def add_signing_key(tenant_id, fields):
    with unit_of_work():
        return signing.add_signing_key(tenant_id, **fields)


def revoke_signing_key(tenant_id, key_id):
    with unit_of_work():
        return signing.revoke_signing_key(tenant_id, key_id)


def set_signature_scheme(tenant_id, fields, principal):
    if fields["scheme"] == "payload" and not principal.operator:
        raise Forbidden(PAYLOAD_BY_OPERATOR)
    with unit_of_work():
        tenant = signing.set_signature_scheme(tenant_id, **fields)
    return signing.scheme_state(tenant)


def rotate_signing_secret(tenant_id, fields):
    with unit_of_work():
        secret, valid_until = service.rotate_signing_secret(tenant_id, **fields)
    return {"signing_secret": secret, "previous_valid_until": valid_until}


def audit_log(tenant_id, query):
    return {"entries": audit.entries(tenant_id, query["limit"], query["before"])}


def daily_usage(tenant_id, query):
    return {"days": usage_history.daily(tenant_id, query["days"])}
