"""Re-seal every stored secret with the ring's first key, one batch of rows per transaction.

Safe to interrupt and to run again: a secret already sealed with the first key is left alone,
so a second run moves only what the first did not reach. Each UPDATE matches the ciphertext it
read, so a secret rotated meanwhile is never overwritten with its old value."""
from dataclasses import dataclass, field

from sqlalchemy import select, update

from app import crypto
from app.extensions import db
from app.keyring import checks
from app.sql import unit_of_work


@dataclass
class Tally:
    resealed: int = 0
    current: int = 0  # already sealed with the first key
    changed: int = 0  # rewritten while this ran (a rotation): the next run looks again
    unsealable: list = field(default_factory=list)  # (table, id, column): no key unseals it
    stopped: bool = False  # by max_batches, before the end

    @property
    def complete(self):
        return not (self.unsealable or self.changed or self.stopped)

    def add(self, batch):
        self.resealed += batch.resealed
        self.current += batch.current
        self.changed += batch.changed
        self.unsealable += batch.unsealable


def run(batch_size, max_batches, report):
    """Re-seal everything, calling `report(table, first_id, last_id, batch)` after each batch
    is committed (`batch`: that batch's own Tally); stop after `max_batches` batches that
    re-sealed something (None: never).
    When every secret is sealed with the first key, the database records only that key."""
    tally, busy_batches = Tally(), 0
    # Recorded before the first secret is re-sealed with it, as every seal records its key: a
    # run interrupted half-way leaves secrets under both keys, and a ring lacking either must
    # then be refused.
    with unit_of_work():
        checks.record_sealing_key()
    for model, columns in checks.SEALED_COLUMNS:
        after_id = None
        while True:
            batch = Tally()
            with unit_of_work():  # a transaction per batch: locks held briefly, progress kept
                ids = _reseal_batch(model, columns, after_id, batch_size, batch)
            if ids is None:
                break
            first_id, last_id = ids
            tally.add(batch)
            report(model.__tablename__, first_id, last_id, batch)
            after_id = last_id
            busy_batches += batch.resealed > 0
            if max_batches is not None and busy_batches >= max_batches:
                tally.stopped = True
                return tally
    if tally.complete:
        with unit_of_work():
            checks.keep_only_sealing_key()
    return tally


def _reseal_batch(model, columns, after_id, batch_size, tally):
    """Re-seal the secrets of up to `batch_size` rows with ids after `after_id` (None: from the
    first); return the first and last ids read, or None when there is none. Ids are integers or strings
    (webhook endpoints): either way the order is the column's own."""
    query = select(model.id, *(getattr(model, column) for column in columns))
    if after_id is not None:
        query = query.where(model.id > after_id)
    rows = db.session.execute(query.order_by(model.id).limit(batch_size)).all()
    for row in rows:
        for column in columns:
            sealed = getattr(row, column)
            if sealed is None:
                continue
            try:
                resealed = crypto.reseal(sealed)
            except crypto.SealedSecretError:
                tally.unsealable.append((model.__tablename__, row.id, column))
                continue
            if resealed is None:
                tally.current += 1
                continue
            written = db.session.execute(
                update(model).where(model.id == row.id, getattr(model, column) == sealed)
                .values({column: resealed}).execution_options(synchronize_session=False))
            if written.rowcount == 1:
                tally.resealed += 1
            else:
                tally.changed += 1
    return (rows[0].id, rows[-1].id) if rows else None
