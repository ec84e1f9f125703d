"""flask tenants ...: provisioning for admins, calling the same service as the HTTP API."""
import click
from flask.cli import AppGroup

from app.cli_support import echo_json, one_line_errors
from app.tenants import service
from app.tenants.plans import PLANS, SIGNATURE_SCHEMES
from app.tenants.schemas import tenant_create_schema, tenant_schema

tenants = AppGroup("tenants", help="Provision and manage tenants.")

TENANT = click.argument("tenant")  # a numeric id or an email address


def _echo_tenant(tenant):
    details = tenant_schema.dump(tenant)
    details["usage"] = service.usage(tenant)
    echo_json(details)


@tenants.command("create")
@click.option("--email", required=True)
@click.option("--plan", type=click.Choice(PLANS), default="free", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--send-email", is_flag=True, help="Email the key (paid plans).")
@one_line_errors
def create(email, plan, as_json, send_email):
    """Create a tenant; its API key and signing secret are printed once."""
    fields = tenant_create_schema.load({"email": email, "plan": plan, "send_email": send_email})
    provisioned = service.create_tenant(**fields)
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
    for tenant in service.list_tenants(limit=10_000):
        state = "active" if tenant.active else "inactive"
        click.echo(f"{tenant.id}\t{tenant.email}\t{tenant.plan}\t{state}\t{tenant.api_key_prefix}...")


@tenants.command("show")
@TENANT
@one_line_errors
def show(tenant):
    """Show one tenant and its usage this month."""
    _echo_tenant(service.find_tenant(tenant))


@tenants.command("set-plan")
@TENANT
@click.argument("plan", type=click.Choice(PLANS))
@one_line_errors
def set_plan(tenant, plan):
    """Change a tenant's plan (takes effect at once)."""
    _echo_tenant(service.update_tenant(tenant, plan=plan))


@tenants.command("set-signature-scheme")
@TENANT
@click.argument("scheme", type=click.Choice(SIGNATURE_SCHEMES))
@one_line_errors
def set_signature_scheme(tenant, scheme):
    """Choose how the tenant's AI service signs responses (bound or payload)."""
    _echo_tenant(service.update_tenant(tenant, signature_scheme=scheme))


@tenants.command("deactivate")
@TENANT
@one_line_errors
def deactivate(tenant):
    """Deactivate a tenant: its key gets 401 from now on."""
    _echo_tenant(service.update_tenant(tenant, active=False))


@tenants.command("activate")
@TENANT
@one_line_errors
def activate(tenant):
    """Reactivate a tenant."""
    _echo_tenant(service.update_tenant(tenant, active=True))


@tenants.command("rotate-key")
@TENANT
@one_line_errors
def rotate_key(tenant):
    """Issue a new API key; the old one is invalid at once."""
    found = service.find_tenant(tenant)
    click.echo(service.rotate_key(found.id))


@tenants.command("rotate-signing-secret")
@TENANT
@click.option("--grace", type=click.IntRange(0, 7 * 86400), default=0, show_default=True,
              help="Seconds during which the previous secret still verifies.")
@one_line_errors
def rotate_signing_secret(tenant, grace):
    """Issue a new response signing secret."""
    click.echo(service.rotate_signing_secret(tenant, grace_seconds=grace))


@tenants.command("usage")
@TENANT
@one_line_errors
def usage(tenant):
    """Show a tenant's usage this month."""
    echo_json(service.usage(service.find_tenant(tenant)))
