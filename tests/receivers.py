"""A webhook receiver over real HTTP for the tests: it records every request and answers as
scripted (a list of statuses; the last one repeats), optionally holding a request open until
released (a worker killed mid-attempt), or answering its status at once and then stalling in
the middle of the body it announced (`stall_body`)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses=(204,), location=None, stall_body=False):
        self.statuses = list(statuses)
        self.location = location
        self.stall_body = stall_body
        self.closing = threading.Event()
        self.requests = []
        self.arrived = threading.Condition()
        self.hold = None  # a threading.Event: answer the next request only once it is set
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hold, receiver.hold = receiver.hold, None
                with receiver.arrived:
                    receiver.requests.append({"headers": {k.lower(): v for k, v in
                                                          self.headers.items()},
                                              "body": body, "path": self.path})
                    status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 \
                        else receiver.statuses[0]
                    receiver.arrived.notify_all()
                if hold is not None and not hold.wait(60):
                    return
                self.send_response(status)
                if receiver.location and 300 <= status < 400:
                    self.send_header("Location", receiver.location)
                if receiver.stall_body:
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    self.wfile.write(b"x" * 100)
                    self.wfile.flush()
                    receiver.closing.wait(60)
                    return
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count, timeout=10):
        """Wait until `count` requests arrived; return them all."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= count, timeout)
        return list(self.requests)

    def events(self):
        return [json.loads(request["body"]) for request in self.requests]


class DeliveryWorker:
    """`flask --app wsgi webhooks deliver` as its own process, logging to a file."""

    def __init__(self, log_path, environment):
        import os

        self.log_path = log_path
        self.environment = {**os.environ, "FLASK_APP": "wsgi", **environment}
        self.process = None

    def start(self):
        import subprocess
        import sys

        from tests.servers import ROOT

        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "flask", "webhooks", "deliver"],
                                        cwd=ROOT, env=self.environment, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        self._wait_until_running()
        return self

    def _wait_until_running(self, timeout=60):
        """Until the worker says it started: its SIGTERM handler is installed by then (a
        SIGTERM during its imports would kill it, not stop it after an attempt)."""
        import time

        deadline = time.monotonic() + timeout
        while b"webhook worker started" not in self.log_path.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the delivery worker did not start: see {self.log_path}")
            time.sleep(0.05)

    def stop(self, sig=None, timeout=30):
        import signal

        if self.process.poll() is None:
            self.process.send_signal(sig or signal.SIGTERM)
            self.process.wait(timeout)
        self._log.close()
        return self.process.returncode
