"""flask intents purge: keep expired intents from growing the database without bound."""
import click
from flask.cli import AppGroup

from app.cli_support import one_line_errors
from app.clock import now_seconds
from app.intents import service
from app.sql import unit_of_work
from app.webhooks import service as webhooks

intents = AppGroup("intents", help="Maintain issued intents.")


@intents.command("purge")
@click.option("--older-than", "retention", type=click.IntRange(0), default=86400, show_default=True,
              help="Retention margin: seconds past expiry before an intent is deleted.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@one_line_errors
def purge(retention, batch_size):
    """Delete intents (and their replay records) expired longer ago than the margin, and
    webhook deliveries older than 30 days."""
    cutoff, purged = now_seconds() - retention, 0
    while True:
        with unit_of_work():  # one transaction a batch: no long lock on a large table
            deleted = service.purge_expired_intents(cutoff, batch_size)
        if not deleted:
            break
        purged += deleted
        click.echo(f"purged {purged} intents")
    with unit_of_work():
        stale = service.purge_idempotency_records()
    click.echo(f"done: {purged} intents and {stale} idempotency records deleted")
    with unit_of_work():  # webhook deliveries are kept 30 days, and purged with the intents
        attempts, events = webhooks.purge_deliveries(now_seconds() - webhooks.RETENTION)
    click.echo(f"webhooks: {attempts} delivery attempts and {events} events deleted")
