"""app.workers' gunicorn workers, in process: how they stop."""
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

from gunicorn import glogging
from gunicorn.config import Config

from app.workers import JsonErrorsThreadWorker


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
