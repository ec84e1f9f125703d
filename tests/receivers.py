"""A webhook receiver over real HTTP for the tests: it records every request and answers as
scripted (a list of statuses; the last one repeats), optionally holding a request open until
released (a worker killed mid-attempt)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses=(204,), location=None):
        self.statuses = list(statuses)
        self.location = location
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
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count, timeout=10):
        """Wait until `count` requests arrived; return them all."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= count, timeout)
        return list(self.requests)

    def events(self):
        return [json.loads(request["body"]) for request in self.requests]
