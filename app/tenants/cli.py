"""flask tenants ...: provisioning for admins, calling the same service as the HTTP API."""
from datetime import datetime, timezone

import click

from app.cli_support import OperatorGroup, echo_json, one_line_errors
from app.sql import unit_of_work
from app.tenants import audit, keys, scopes, service, signing, usage_history
from app.tenants.plans import PLANS, SIGNATURE_SCHEMES
from app.tenants.schemas import (
    EXPIRES_IN_MAX,
    api_key_create_schema,
    GRACE_MAX,
    PUBLIC_KEY_MAX,
    signature_scheme_schema,
    signing_key_create_schema,
    signing_key_schema,
    tenant_create_schema,
    tenant_schema,
)

TENANT_HELP = "TENANT is the tenant's id (as `list` shows it) or its email address."

tenants = OperatorGroup("tenants", help="Provision and manage tenants. " + TENANT_HELP)

TENANT = click.argument("tenant")


def _tenant_command(name):
    """A command that takes TENANT, saying in its help what TENANT may be."""
    return tenants.command(name, epilog=TENANT_HELP)


def _echo_tenant(tenant):
    details = tenant_schema.dump(tenant)
    details["usage"] = service.usage(tenant)
    echo_json(details)


def _update(tenant, **changes):
    with unit_of_work():
        updated = service.update_tenant(tenant, **changes)
    _echo_tenant(updated)


@tenants.command("create")
@click.option("--email", required=True)
@click.option("--plan", type=click.Choice(PLANS), default="free", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--send-email", is_flag=True,
              help="Email the key and secret to the tenant (paid plans only).")
@one_line_errors
def create(email, plan, as_json, send_email):
    """Create a tenant; its API key and signing secret are printed once."""
    fields = tenant_create_schema.load({"email": email, "plan": plan, "send_email": send_email})
    del fields["send_email"]
    with unit_of_work():
        provisioned = service.create_tenant(**fields)
    if send_email:
        service.deliver_keys(provisioned)
    tenant = provisioned.tenant
    if as_json:
        echo_json({"tenant_id": tenant.id, "email": tenant.email, "plan": tenant.plan,
                   "api_key": provisioned.api_key, "signing_secret": provisioned.signing_secret})
    else:
        click.echo(f"tenant {tenant.id} <{tenant.email}> on plan {tenant.plan}")
        click.echo(f"api key:        {provisioned.api_key}")
        click.echo(f"signing secret: {provisioned.signing_secret}")
        click.echo("Store both now: they are not shown again.")
    if provisioned.email_sent is False:
        click.echo(f"warning: key email not sent: {provisioned.email_error}", err=True)


@tenants.command("list")
@one_line_errors
def list_():
    """List tenants."""
    listed = service.list_tenants(limit=10_000)  # no header for an error
    click.echo("ID\tEMAIL\tPLAN\tSTATE")
    for tenant in listed:
        state = "active" if tenant.active else "inactive"
        click.echo(f"{tenant.id}\t{tenant.email}\t{tenant.plan}\t{state}")


@_tenant_command("show")
@TENANT
@one_line_errors
def show(tenant):
    """Show one tenant and its usage this month."""
    _echo_tenant(service.find_tenant(tenant))


@_tenant_command("set-plan")
@TENANT
@click.argument("plan", type=click.Choice(PLANS))
@one_line_errors
def set_plan(tenant, plan):
    """Change a tenant's plan (takes effect at once)."""
    _update(tenant, plan=plan)


GRACE = click.option("--grace", type=click.IntRange(0, GRACE_MAX), default=0, show_default=True,
                     help="Seconds during which the previous one still verifies.")


@_tenant_command("set-signature-scheme")
@TENANT
@click.argument("scheme", type=click.Choice(SIGNATURE_SCHEMES))
@GRACE
@one_line_errors
def set_signature_scheme(tenant, scheme, grace):
    """Choose how the tenant's AI service signs responses: bound, payload (HMAC with the
    signing secret) or ed25519 (its registered public keys)."""
    with unit_of_work():
        updated = signing.set_signature_scheme(service.find_tenant(tenant).id, scheme,
                                               grace_seconds=grace)
    echo_json(signature_scheme_schema.dump(signing.scheme_state(updated)))


signing_keys = OperatorGroup("signing-keys", help="Ed25519 public keys with which a tenant's AI "
                                                  "service signs responses. " + TENANT_HELP)
tenants.add_command(signing_keys)


@signing_keys.command("add", epilog=TENANT_HELP)
@TENANT
@click.argument("public_key_file", type=click.File("r", encoding="utf-8"))
@click.option("--name", help="A name to tell keys apart.")
@click.option("--expires-in", type=click.IntRange(1, EXPIRES_IN_MAX),
              help="Seconds until the key stops verifying.")
@one_line_errors
def add_signing_key(tenant, public_key_file, name, expires_in):
    """Register a public key, read from PUBLIC_KEY_FILE (PEM or base64; - for stdin)."""
    try:
        # One character past the limit is enough for the schema to refuse it: a huge file (or
        # /dev/zero) is never read whole into memory.
        public_key = public_key_file.read(PUBLIC_KEY_MAX + 1)
    except UnicodeDecodeError:
        raise click.ClickException("PUBLIC_KEY_FILE must be text: a PEM file or base64") from None
    fields = signing_key_create_schema.load(
        {"public_key": public_key, "name": name, "expires_in": expires_in})
    with unit_of_work():
        key = signing.add_signing_key(service.find_tenant(tenant).id, **fields)
    echo_json(signing_key_schema.dump(key))


@signing_keys.command("list", epilog=TENANT_HELP)
@TENANT
@one_line_errors
def list_signing_keys(tenant):
    """List a tenant's active signing keys."""
    listed = signing.list_signing_keys(service.find_tenant(tenant).id)  # no header for an error
    click.echo("ID\tNAME\tFINGERPRINT\tCREATED_AT\tEXPIRES_AT")
    for key in listed:
        click.echo(f"{key.id}\t{key.name or '-'}\t{key.fingerprint}\t{key.created_at}\t"
                   f"{key.expires_at or '-'}")


@signing_keys.command("revoke", epilog=TENANT_HELP)
@TENANT
@click.argument("key_id")
@one_line_errors
def revoke_signing_key(tenant, key_id):
    """Revoke a signing key: signatures made with it are refused from now on."""
    with unit_of_work():
        key = signing.revoke_signing_key(service.find_tenant(tenant).id, key_id)
    click.echo(f"signing key {key.id} revoked")


@_tenant_command("deactivate")
@TENANT
@one_line_errors
def deactivate(tenant):
    """Deactivate a tenant: its key gets 401 from now on."""
    _update(tenant, active=False)


@_tenant_command("activate")
@TENANT
@one_line_errors
def activate(tenant):
    """Reactivate a tenant."""
    _update(tenant, active=True)


@_tenant_command("rotate-key")
@TENANT
@click.option("--key-id", help="The key to replace (`flask tenants keys list T`); needed when "
                               "the tenant holds more than one.")
@one_line_errors
def rotate_key(tenant, key_id):
    """Replace an API key by a new one of the same name, scopes and expiry; the old one is
    invalid at once. The new key alone goes to stdout."""
    with unit_of_work():
        api_key, old = keys.rotate(service.find_tenant(tenant).id, key_id, operator=True)
    click.echo(f"replaced key {old.id} ({old.name}, {old.prefix}...)", err=True)
    click.echo(api_key)


@_tenant_command("rotate-signing-secret")
@TENANT
@GRACE
@one_line_errors
def rotate_signing_secret(tenant, grace):
    """Issue a new response signing secret."""
    with unit_of_work():
        signing_secret, _ = service.rotate_signing_secret(tenant, grace_seconds=grace)
    click.echo(signing_secret)


@_tenant_command("usage")
@TENANT
@click.option("--days", type=click.IntRange(1, usage_history.MAX_DAYS),
              help="Show the last DAYS UTC days by outcome, with a bar per day.")
@one_line_errors
def usage(tenant, days):
    """Show a tenant's usage this month, or day by day with --days."""
    found = service.find_tenant(tenant)
    if days is None:
        echo_json(service.usage(found))
        return
    history = usage_history.daily(found.id, days)
    widest = max((day["verifications"] for day in history), default=0)
    click.echo(f"{'DATE':10}  {'VERIFIED':>8}  {'CLEARED':>7}  {'BLOCKED':>7}  BAR (# cleared, "
               f"x blocked)")
    for day in history:
        blocked = day["verifications"] - day["cleared"]
        click.echo(f"{day['date']:10}  {day['verifications']:>8}  {day['cleared']:>7}  "
                   f"{blocked:>7}  {_bar(day['cleared'], blocked, widest)}")


BAR_WIDTH = 40


def _bar(cleared, blocked, widest):
    """A bar scaled to the busiest day: a trend reads faster from bars than from numbers."""
    if not widest:
        return ""
    scale = BAR_WIDTH / widest
    cleared_cells = round(cleared * scale)
    blocked_cells = round((cleared + blocked) * scale) - cleared_cells
    return "#" * cleared_cells + "x" * blocked_cells


@_tenant_command("audit")
@TENANT
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--before", type=click.IntRange(1), help="Entries older than this id.")
@one_line_errors
def audit_log(tenant, limit, before):
    """Show who changed a tenant's keys, secrets, scheme, plan or active flag, newest first."""
    entries = audit.entries(service.find_tenant(tenant).id, limit, before)  # an error: no header
    click.echo("ID\tAT\tACTION\tACTOR\tADDRESS\tDETAILS")
    for entry in entries:
        at = datetime.fromtimestamp(entry["at"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        details = " ".join(f"{name}={value}" for name, value in sorted(entry["details"].items()))
        click.echo(f"{entry['id']}\t{at}\t{entry['action']}\t{entry['actor']}\t"
                   f"{entry['address'] or '-'}\t{details or '-'}")


api_keys = OperatorGroup("keys", help="A tenant's API keys: several may be active, so a backend "
                                      "rolls keys without downtime. " + TENANT_HELP)
tenants.add_command(api_keys)


@api_keys.command("add", epilog=TENANT_HELP)
@TENANT
@click.option("--name", required=True, help="A name to tell keys apart.")
@click.option("--expires-in", type=click.IntRange(1, EXPIRES_IN_MAX),
              help="Seconds until the key stops working.")
@click.option("--scope", "scope_names", multiple=True, type=click.Choice(scopes.SCOPES),
              help="What the key may do; repeat for several (default: intents only).")
@one_line_errors
def add_api_key(tenant, name, expires_in, scope_names):
    """Create an API key; it is printed once."""
    fields = api_key_create_schema.load({"name": name, "expires_in": expires_in,
                                         "scopes": list(scope_names) or None})
    with unit_of_work():
        row, api_key = keys.create_key(service.find_tenant(tenant).id, **fields)
    click.echo(f"api key {row.id} ({row.name}, scopes {','.join(scopes.listed(row.scopes))}): "
               f"{api_key}")
    click.echo("Store it now: it is not shown again.")


@api_keys.command("list", epilog=TENANT_HELP)
@TENANT
@one_line_errors
def list_api_keys(tenant):
    """List a tenant's active API keys (never a secret)."""
    listed = keys.list_keys(service.find_tenant(tenant).id)  # no header for an error
    click.echo("ID\tNAME\tPREFIX\tSCOPES\tCREATED_AT\tEXPIRES_AT")
    for row in listed:
        click.echo(f"{row.id}\t{row.name}\t{row.prefix}...\t{','.join(scopes.listed(row.scopes))}"
                   f"\t{row.created_at}\t{row.expires_at or '-'}")


@api_keys.command("revoke", epilog=TENANT_HELP)
@TENANT
@click.argument("key_id")
@one_line_errors
def revoke_api_key(tenant, key_id):
    """Revoke an API key: it is refused from now on, on every worker."""
    with unit_of_work():
        row = keys.revoke_key(service.find_tenant(tenant).id, key_id)
    click.echo(f"api key {row.id} ({row.name}) revoked")
