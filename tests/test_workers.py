"""app.workers' gunicorn workers: how they stop (in process), and how idle sync workers wait
for a connection (real gunicorn workers)."""
import os
import select
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gunicorn import glogging
from gunicorn.config import Config

from app.workers import JsonErrorsThreadWorker
from tests.support import raw_http


def test_a_second_quit_signal_inside_the_first_does_not_deadlock_a_gthread_worker():
    config = Config()
    config.set("threads", 4)
    worker = JsonErrorsThreadWorker(age=1, ppid=os.getpid(), sockets=[], app=None, timeout=30,
                                    cfg=config, log=glogging.Logger(config))

    class SecondSignalDuringShutdown(ThreadPoolExecutor):
        """The pool as gunicorn's quit handler finds it, with the second signal (SIGQUIT from
        the master after the terminal's SIGINT) handled while the first holds its lock."""

        signalled = False

        def shutdown(self, wait=True, **kwargs):
            with self._shutdown_lock:
                if not self.signalled:
                    self.signalled = True
                    worker.handle_quit(signal.SIGQUIT, None)
            super().shutdown(wait, **kwargs)

    worker.tpool = SecondSignalDuringShutdown(max_workers=1)
    exits = []

    def first_signal():
        try:
            worker.handle_quit(signal.SIGINT, None)
        except SystemExit as stop:  # how the handler ends the worker process
            exits.append(stop.code)

    quitting = threading.Thread(target=first_signal, daemon=True)
    quitting.start()
    quitting.join(10)
    assert not quitting.is_alive(), "the worker deadlocked in its quit handler"
    assert exits == [0] and worker.tpool.signalled
    worker.tmp.close()


def _wake_ups(pid):
    """How many times the process's main thread has gone to sleep and been woken (the worker's
    request loop runs there; the statement-deadline watcher is a thread of its own)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


def _workers_of(master, count, wait_s=30):
    """The master's `count` worker pids, once it has forked them all."""
    children = Path(f"/proc/{master}/task/{master}/children")
    deadline = time.monotonic() + wait_s
    while True:
        workers = [int(pid) for pid in children.read_text().split()]
        if len(workers) == count or time.monotonic() > deadline:
            assert len(workers) == count
            return workers
        time.sleep(0.1)


def _get_on_a_new_connection(port, path):
    status, _, _ = raw_http(port, f"GET {path} HTTP/1.1\r\nHost: localhost\r\n"
                                  "Connection: close\r\n\r\n".encode())
    return status


@pytest.mark.skipif(not hasattr(select, "EPOLLEXCLUSIVE"), reason="Linux's EPOLLEXCLUSIVE")
def test_a_connection_wakes_one_idle_sync_worker_not_all(embedded_gunicorn):
    """gunicorn's own sync workers all wait in select() on the shared listener, and every one
    is woken by every connection: eight of them woke 5 to 6 times a request, one at a time.
    Ours wait with EPOLLEXCLUSIVE: each connection wakes one, which may sleep once more
    waiting for the request's bytes (about 2 a request)."""
    start, _ = embedded_gunicorn
    server = start(workers=8, threads=1)
    workers = _workers_of(server.process.pid, 8)
    for _ in range(20):  # every worker has imported and served what a request needs
        assert _get_on_a_new_connection(server.port, "/no-such-page") == 404
    before = sum(_wake_ups(pid) for pid in workers)
    requests_made = 200
    for _ in range(requests_made):  # one at a time: the other workers are idle throughout
        assert _get_on_a_new_connection(server.port, "/no-such-page") == 404
    woken = sum(_wake_ups(pid) for pid in workers) - before
    assert woken < 3 * requests_made
