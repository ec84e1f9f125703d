"""flask intents purge: keep expired intents from growing the database without bound."""
import click
from flask.cli import AppGroup

from app.cli_support import one_line_errors
from app.intents import service

intents = AppGroup("intents", help="Maintain issued intents.")


@intents.command("purge")
@click.option("--older-than", "retention", type=click.IntRange(0), default=86400, show_default=True,
              help="Retention margin: seconds past expiry before an intent is deleted.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@one_line_errors
def purge(retention, batch_size):
    """Delete intents (and their replay records) expired longer ago than the margin."""
    purged, stale = service.purge(retention, batch_size, progress=click.echo)
    click.echo(f"done: {purged} intents and {stale} idempotency records deleted")
