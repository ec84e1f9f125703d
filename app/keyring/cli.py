"""flask secrets ...: the stored secrets and the encryption key ring."""
import click

from app.cli_support import OperatorGroup
from app.keyring import reseal as resealing

secrets = OperatorGroup("secrets", help="Stored secrets and the SECRET_ENCRYPTION_KEY ring.")


@secrets.command("reseal")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=500, show_default=True,
              help="Rows per transaction.")
@click.option("--max-batches", type=click.IntRange(1),
              help="Stop after this many batches that re-sealed something (to spread the work "
                   "out); run again to continue.")
def reseal(batch_size, max_batches):
    """Re-seal every stored secret with the first key of SECRET_ENCRYPTION_KEY.

    Rotate the key in two rounds (deploy/README): first add the new key after the old one
    (SECRET_ENCRYPTION_KEY=old,new) and restart every process on every host; then put it first
    (new,old) and restart them all again; then run this, then drop the old key. (A process
    still on the old key alone cannot unseal what new,old seals: its verifies would be 503.)
    Safe to interrupt and to run again: each batch is its own transaction, and secrets already
    sealed with the first key are left alone."""

    def report(table, first_id, last_id, batch):
        click.echo(f"{table} {first_id}-{last_id}: {batch.resealed} re-sealed, "
                   f"{batch.current} already sealed with the first key")

    tally = resealing.run(batch_size, max_batches, report)
    if tally.stopped:
        click.echo(f"stopped after {max_batches} batches: run again to continue")
        return
    for table, row_id, column in tally.unsealable:
        click.echo(f"{table} {row_id}: {column} cannot be unsealed with any key of the ring "
                   "(add the key that sealed it, or rotate it)", err=True)
    if tally.changed:
        click.echo(f"{tally.changed} secrets changed while this ran: run again", err=True)
    if not tally.complete:
        raise SystemExit(1)
    click.echo(f"done: {tally.resealed} re-sealed, {tally.current} already sealed with the "
               "first key; the database now records the first key only")
