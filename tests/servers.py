"""Real gunicorn workers for the guarantees that are about several processes."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


# Every port this test run gave out. The kernel may offer a port again once its probe socket
# is closed, and two servers of one test handed the same port would see one bind fail while
# the other answers for both.
HANDED_OUT = set()


# TEST_PORTS="low-high": the ports this run hands out, where two runs share the machine at once
# (.ci/run runs the SQLite and PostgreSQL suites side by side, each in a range of its own below
# the kernel's ephemeral ports, which neither could then be given by the other's probe).
_RANGE = [int(bound) for bound in os.environ["TEST_PORTS"].split("-")] if os.environ.get(
    "TEST_PORTS") else None
_NEXT = iter(range(_RANGE[0], _RANGE[1] + 1)) if _RANGE else None


def free_port():
    """A local port that is free now and that no other server of this run was given."""
    while True:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", next(_NEXT) if _NEXT else 0))
            except OSError:
                continue  # taken by another program: the next one
            port = probe.getsockname()[1]
        if port not in HANDED_OUT:
            HANDED_OUT.add(port)
            return port


class GunicornServer:
    def __init__(self, log_path, environment, workers=4, threads=1, config="deploy/gunicorn.conf.py",
                 ca_file=None):
        self.port = free_port()
        self.ca_file = ca_file  # set when gunicorn terminates TLS itself
        self.url = f"{'https' if ca_file else 'http'}://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.environment = {
            **os.environ,
            **environment,
            "GUNICORN_BIND": f"127.0.0.1:{self.port}",
            "GUNICORN_WORKERS": str(workers),
            "GUNICORN_THREADS": str(threads),
        }
        self.config = config
        self.process = None

    def start(self, wait=30, serving=(200,)):
        """Start, and wait until /health answers one of `serving` (a store that does not
        answer: 503)."""
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", self.config, "wsgi:app"],
            cwd=ROOT, env=self.environment, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                if requests.get(self.url + "/health", timeout=5,
                                verify=self.ca_file or True).status_code in serving:
                    return self
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gunicorn did not become healthy:\n{self.log_path.read_text()[-3000:]}")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def log_records(self):
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        return records

    def pids_for(self, request_ids):
        """The worker pids that served the given request ids (from the JSON access log)."""
        wanted = set(request_ids)
        return {record["pid"] for record in self.log_records()
                if record.get("logger") == "app.access" and record.get("request_id") in wanted}


class FreezableProxy:
    """A TCP proxy in front of a server (PostgreSQL) that can stop passing bytes while keeping
    every connection open: a server that has stopped answering, as a paused PgBouncer, a hung
    primary or a network dropping packets look to a client."""

    def __init__(self, host, port, listen_port=None):
        self.target = (host, port)
        self.port = listen_port or free_port()
        self._thawed = threading.Event()
        self._thawed.set()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self):
        self._thawed.clear()

    def thaw(self):
        self._thawed.set()

    def close(self):
        self.thaw()
        self._listener.close()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pass, args=(source, sink), daemon=True).start()

    def _pass(self, source, sink):
        try:
            while data := source.recv(65536):
                self._thawed.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            sink.close()
