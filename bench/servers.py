"""gunicorn servers under test, each with deploy/gunicorn.conf.py and the same settings."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, name, wsgi_app, ready_path, workers, log_path, extra_env=None):
        self.name, self.wsgi_app, self.ready_path = name, wsgi_app, ready_path
        self.workers, self.log_path = workers, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(extra_env or {}),
                    "GUNICORN_BIND": f"127.0.0.1:{self.port}",
                    "GUNICORN_WORKERS": str(workers),
                    # no worker recycling mid-measurement (a restart would show up as latency)
                    "GUNICORN_MAX_REQUESTS": "0"}
        self.process = None

    def start(self):
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", self.wsgi_app],
            cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s=60):
        """Until the server answers and every worker has forked (plus a moment to import)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} gunicorn exited; see {self.log_path}")
            try:
                if (requests.get(self.url + self.ready_path, timeout=2).status_code == 200
                        and len(self.worker_pids()) == self.workers):
                    time.sleep(2)
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout_s} s; see {self.log_path}")

    @property
    def master_pid(self):
        return self.process.pid

    def worker_pids(self):
        pids = []
        for entry in Path("/proc").glob("[0-9]*/stat"):
            try:
                raw = entry.read_text()
            except OSError:
                continue
            if int(raw[raw.rindex(")") + 2:].split()[1]) == self.master_pid:
                pids.append(int(entry.parent.name))
        return pids

    def worker_peak_rss_mb(self):
        peaks = {}
        for pid in self.worker_pids():
            status = Path(f"/proc/{pid}/status").read_text()
            peaks[str(pid)] = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
        return peaks

    def stop(self):
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
