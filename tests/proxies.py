"""A real nginx in front of gunicorn, run from the repository's own configs, and slow clients."""
import getpass
import select
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

from tests.servers import ROOT, free_port


def nginx_binary():
    packaged = Path("/usr/sbin/nginx")
    return shutil.which("nginx") or (str(packaged) if packaged.exists() else None)


def _replace(text, replacements):
    for old, new in replacements.items():
        assert old in text, f"the config no longer contains {old!r}: update the test's rendering"
        text = text.replace(old, new)
    return text


def render(name, directory, upstream_port, certificates=None):
    """deploy/<name> with only what belongs to this host replaced: addresses, ports, files.
    Returns (config path, the port clients use, nginx.conf's plain HTTP port or None)."""
    directory = Path(directory)
    port, plain_port = free_port(), None
    text = (ROOT / "deploy" / name).read_text()
    if name == "nginx.conf":
        plain_port = free_port()
        text = _replace(text, {
            "user www-data;": f"user {getpass.getuser()};",
            "/run/nginx-intentgate.pid": str(directory / "nginx.pid"),
            "/var/log/nginx/": f"{directory}/",
            "/etc/ssl/intentgate/fullchain.pem": str(certificates["cert"]),
            "/etc/ssl/intentgate/privkey.pem": str(certificates["key"]),
            "server 127.0.0.1:8000;": f"server 127.0.0.1:{upstream_port};",
            "listen 80;": f"listen 127.0.0.1:{plain_port};",
            "listen [::]:80;": "",
            "listen 443 ssl http2;": f"listen 127.0.0.1:{port} ssl http2;",
            "listen [::]:443 ssl http2;": "",
        })
    else:
        text = _replace(text, {
            "worker_processes auto;": f"worker_processes auto;\npid {directory / 'nginx.pid'};",
            "server app:8000;": f"server 127.0.0.1:{upstream_port};",
            "listen 8000;": f"listen 127.0.0.1:{port};",
        })
    # Scratch files under the test's directory rather than the packaged /var/lib/nginx.
    text = _replace(text, {"http {": f"http {{\n    client_body_temp_path {directory}/body;\n"
                                     f"    proxy_temp_path {directory}/proxy;"})
    path = directory / name
    path.write_text(text)
    return path, port, plain_port


class NginxServer:
    def __init__(self, binary, config_path, port, directory):
        self.command = [binary, "-c", str(config_path), "-p", f"{directory}/",
                        "-e", str(Path(directory) / "error.log"), "-g", "daemon off;"]
        self.port = port
        self.log_path = Path(directory) / "nginx.out"
        self.process = None

    def start(self, wait=20):
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.log_path.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("nginx did not listen in time")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # fast shutdown: slow clients are dropped
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class SlowClients:
    """`count` connections that each send a request header one byte per second, never ending it
    (TLS first when `context` is given): each holds whatever reads its request."""

    def __init__(self, port, count=20, context=None):
        self.port, self.count, self.context = port, count, context
        self.sockets, self.lock, self.stopped = [], threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)

    def __enter__(self):
        for _ in range(self.count):
            connection = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            if self.context is not None:
                connection = self.context.wrap_socket(connection, server_hostname="127.0.0.1")
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            connection.setblocking(False)
            self.sockets.append(connection)
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stopped.set()
        self.thread.join(10)
        for connection in self.sockets:
            connection.close()

    def _trickle(self):
        while not self.stopped.wait(1):
            with self.lock:
                for connection in self.sockets:
                    try:
                        connection.send(b"a")
                    except (OSError, ssl.SSLError):
                        pass  # closed by the server: held() tells

    def held(self):
        """How many are still open with nothing answered: still waiting on the server."""
        with self.lock:
            return sum(self._waiting(connection) for connection in self.sockets)

    @staticmethod
    def _waiting(connection):
        try:
            if not select.select([connection], [], [], 0)[0]:
                return True
            # Readable: a TLS session ticket reads as no data yet (SSLWantReadError); b"" is a
            # close and anything else an answer (an error, a timeout): no longer waiting.
            connection.recv(1)
            return False
        except (BlockingIOError, ssl.SSLWantReadError):
            return True
        except OSError:
            return False
