"""A deadline for the PostgreSQL statements of a request.

A database that stops answering on a connection already open (a PgBouncer PAUSE, a hung primary,
a network that drops packets) would hold the request until gunicorn's worker timeout: libpq waits
for the answer in C, with no timeout of its own (connect_timeout covers connecting only), and no
signal reaches Python meanwhile, so gunicorn's SIGABRT is never handled, the worker is SIGKILLed
and the client gets no answer at all. Instead one thread per worker process watches the
statements in flight: one still unanswered at its deadline has its socket shut down, libpq reads
the end of the connection, and the statement fails as a disconnect, which app.database answers
with the contract's 503 (and a fresh pool). A statement costs two uncontended lock operations.
"""
import os
import socket
import threading
import time

POLL_SECONDS = 0.25
CUT = float("inf")  # an entry's deadline once its connection was cut: never cut twice

_lock = threading.Lock()
_in_flight = {}  # thread id -> [deadline (perf_counter), socket's fd]
_watcher = None


def start(dbapi_connection, seconds):
    """Watch the statement this thread is about to run on `dbapi_connection`."""
    if _watcher is None:  # not yet started in this process
        _start_watcher()
    with _lock:
        _in_flight[threading.get_ident()] = [time.perf_counter() + seconds,
                                             dbapi_connection.fileno()]


def stop():
    """The statement has its answer (or its error): stop watching it. True when the watcher cut
    its connection meanwhile: the statement may have had its answer just before, but the
    connection is dead all the same and must not go back to the pool."""
    with _lock:
        entry = _in_flight.pop(threading.get_ident(), None)
    return entry is not None and entry[0] == CUT


def _start_watcher():
    global _watcher
    with _lock:
        if _watcher is None:
            _watcher = threading.Thread(target=_watch, name="statement-deadline", daemon=True)
            _watcher.start()


def _watch():
    while True:
        time.sleep(POLL_SECONDS)
        now = time.perf_counter()
        with _lock:  # held while cutting: the statement's thread cannot close the fd meanwhile
            for entry in _in_flight.values():
                if entry[0] <= now:
                    entry[0] = CUT
                    _cut(entry[1])


def _cut(fd):
    try:
        # A second descriptor of the same socket: shutting it down ends the connection under
        # libpq, which owns (and will close) the first.
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the server: libpq has its answer


def _forget_after_fork():
    # gunicorn forks workers: a child starts its own watcher, with a lock no thread holds.
    global _lock, _watcher
    _lock, _watcher = threading.Lock(), None
    _in_flight.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
