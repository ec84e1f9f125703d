"""What gunicorn's master reads from files for its workers: the TLS context and the taxonomy.

The master reads each once when it starts and again at each reload (SIGHUP), and its workers
inherit what it read when they fork. Left to gunicorn and the workers, the files were read far
more often: gunicorn builds a new TLS context from the certificate and key for every connection
(2 ms of a worker's CPU each here), and each worker read TAXONOMY_PATH when it booted. So a
pair or a taxonomy rewritten in place broke every handshake while it was half written, and a
broken taxonomy stopped the host: the next worker replaced after GUNICORN_MAX_REQUESTS failed
to boot, and gunicorn stops when a worker fails to boot.

A file that cannot be read stops gunicorn at its start with one line, as any bad setting does.
At a reload the master logs it and keeps what it read before, so its workers go on with the
same TLS pair and taxonomy (gunicorn would exit on the error, and its workers with it).
"""
import logging

from app.config import ConfigError

# gunicorn's own error log (the master's, in the app's JSON form: app.logs.GunicornLogger).
log = logging.getLogger("gunicorn.error")

_read = {}  # (what, its files) -> what the master last read of them
_master = {"running": False}


def master_started():
    """Called by gunicorn's on_starting. From then on, in the master and in every worker it
    forks, what cannot be read or checked is a reload's or a recycled worker's, not the start's:
    said, never a reason to stop (app.keyring.checks asks too)."""
    _master["running"] = True


def master_running():
    return _master["running"]


def read(what, files, reader):
    """reader() of `files` (a path, or the TLS pair's), kept for the workers. Its ConfigError
    stops the start; at a reload it is logged, and what was read before is answered instead."""
    try:
        value = reader()
    except ConfigError as error:
        if not master_running() or (what, files) not in _read:
            raise
        log.error("reload: %s; the %s read before is kept", error, what)
        return _read[what, files]
    _read[what, files] = value
    return value


def inherited(what, files, reader):
    """What the master read of `files`, or reader() where no master read them (the flask CLI,
    the tests, the webhook workers)."""
    try:
        return _read[what, files]
    except KeyError:
        return reader()
