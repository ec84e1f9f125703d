"""flask admin-keys ...: keys for internal services."""
import click
from flask.cli import AppGroup

from app.admin import service
from app.cli_support import echo_json, one_line_errors

admin_keys = AppGroup("admin-keys", help="Manage admin keys for internal services.")


@admin_keys.command("create")
@click.option("--name", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@one_line_errors
def create(name, as_json):
    """Create an admin key; it is printed once."""
    issued = service.create_admin_key(name.strip())
    if as_json:
        echo_json({"admin_key_id": issued.admin_key.id, "name": issued.admin_key.name,
                   "api_key": issued.api_key, "signing_secret": issued.signing_secret})
    else:
        click.echo(f"admin key {issued.admin_key.id} ({issued.admin_key.name})")
        click.echo(f"api key:        {issued.api_key}")
        click.echo(f"signing secret: {issued.signing_secret}")
        click.echo("Store both now: they are not shown again.")


@admin_keys.command("list")
@one_line_errors
def list_():
    """List admin keys."""
    for admin_key in service.list_admin_keys():
        state = "active" if admin_key.active else "revoked"
        click.echo(f"{admin_key.id}\t{admin_key.name}\t{state}\t{admin_key.key_prefix}...")


@admin_keys.command("revoke")
@click.argument("admin_key")
@one_line_errors
def revoke(admin_key):
    """Revoke an admin key (by id or name)."""
    revoked = service.revoke_admin_key(admin_key)
    click.echo(f"admin key {revoked.id} ({revoked.name}) revoked")
