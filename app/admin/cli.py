"""flask admin-keys ...: keys for internal services."""
import shlex

import click

from app.admin import service
from app.cli_support import OperatorGroup, echo_json, one_line_errors
from app.sql import unit_of_work

admin_keys = OperatorGroup(
    "admin-keys",
    help="Manage admin keys for internal services. A key is named when it is created "
         "(not blank, not all digits); revoke takes the id that `list` shows, or --name.",
)


@admin_keys.command("create")
@click.option("--name", required=True,
              help="A unique name, such as the service that uses the key (not all digits).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@one_line_errors
def create(name, as_json):
    """Create an admin key; it is printed once."""
    with unit_of_work():
        issued = service.create_admin_key(name)
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
    listed = service.list_admin_keys()  # no header for an error
    click.echo("ID\tNAME\tSTATE\tPREFIX")
    for admin_key in listed:
        state = "active" if admin_key.active else "revoked"
        click.echo(f"{admin_key.id}\t{admin_key.name}\t{state}\t{admin_key.key_prefix}...")


@admin_keys.command("revoke")
@click.argument("admin_key_id", required=False)
@click.option("--name", help="Revoke the key with this name instead of giving its id.")
@one_line_errors
def revoke(admin_key_id, name):
    """Revoke an admin key by its id, or by --name NAME.

    ADMIN_KEY_ID is the id that `flask admin-keys list` shows.
    """
    if (admin_key_id is None) == (name is None):
        raise click.ClickException("give either the admin key's id or --name NAME")
    if admin_key_id is not None and not (admin_key_id.isascii() and admin_key_id.isdigit()):
        raise click.ClickException(
            f"admin key ids are numbers; to revoke by name, use --name {shlex.quote(admin_key_id)}"
        )
    with unit_of_work():
        revoked = service.revoke_admin_key(
            admin_key_id=None if admin_key_id is None else int(admin_key_id), name=name
        )
    click.echo(f"admin key {revoked.id} ({revoked.name}) revoked")
