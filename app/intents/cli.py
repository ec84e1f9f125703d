"""flask intents purge: keep expired intents from growing the database without bound."""
import click
from flask import current_app

from app.cli_support import CommandGroup, one_line_errors
from app.clock import now_seconds
from app.intents import service
from app.intents.schemas import TTL_MAX
from app.sql import unit_of_work
from app.webhooks import service as webhooks

# Not an OperatorGroup: the purge's log lines are the timer's record of what it deleted.
intents = CommandGroup("intents", help="Maintain issued intents.")


@intents.command("purge")
@click.option("--older-than", "retention", type=click.IntRange(0),
              help="Retention margin: seconds past expiry before an intent is deleted; at least, "
                   "and by default, the longest ttl plus twice CLOCK_SKEW_SECONDS (86520 s with "
                   "the default skew): a smaller margin is raised to it.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@one_line_errors
def purge(retention, batch_size):
    """Delete intents (and their replay records) expired longer ago than the margin,
    idempotency records past their 24 h, and webhook deliveries older than 30 days: each in
    transactions of at most --batch-size rows, so it is safe to interrupt and run again."""
    least = _least_retention()
    if retention is not None and retention < least:
        # Said, not refused: a timer written for the earlier default (86400) goes on purging.
        click.echo(f"warning: --older-than {retention} is raised to {least} seconds (the "
                   "longest ttl and twice CLOCK_SKEW_SECONDS): a replay record purged sooner "
                   "lets its response clear again", err=True)
    cutoff = now_seconds() - max(retention or 0, least)
    purged = _in_batches(lambda: (service.purge_expired_intents(cutoff, batch_size),),
                         progress=lambda totals: click.echo(f"purged {totals[0]} intents"))[0]
    stale = _in_batches(lambda: (service.purge_idempotency_records(batch_size),))[0]
    click.echo(f"done: {purged} intents and {stale} idempotency records deleted")
    # Webhook deliveries are kept 30 days, and purged with the intents.
    cutoff = now_seconds() - webhooks.RETENTION
    attempts, events = _in_batches(lambda: webhooks.purge_deliveries(cutoff, batch_size))
    click.echo(f"webhooks: {attempts} delivery attempts and {events} events deleted")


def _least_retention():
    """How long after its intent's expiry a replay record can still catch a replay. The
    response's timestamp is at most the intent's expiry plus the skew; a new intent issued up
    to the skew after that timestamp lets it through the time window, and is verified up to
    the longest ttl later: until then the record must be there (a response signed under the
    `payload` scheme names no intent)."""
    return TTL_MAX + 2 * current_app.config["CLOCK_SKEW_SECONDS"]


def _in_batches(purge_batch, progress=None):
    """Run `purge_batch` (it returns counts) one transaction at a time, so that no long lock
    is held on a large table, until it deletes nothing; return the sums. `progress` is told
    the sums after each batch that deleted something."""
    totals = None
    while True:
        with unit_of_work():
            counts = purge_batch()
        totals = counts if totals is None else tuple(map(sum, zip(totals, counts)))
        if not any(counts):
            return totals
        if progress is not None:
            progress(totals)
