"""Scaled-out neighbours for the multi-process tests: PgBouncer in transaction pooling mode, a
three-master Redis Cluster, and two gunicorn "hosts" answering in turn. Each starts from a
configuration written here, on free local ports, and stops with its fixture."""
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.servers import HANDED_OUT, free_port

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
REDIS_SERVER, REDIS_CLI = shutil.which("redis-server"), shutil.which("redis-cli")


def _wait_for_port(port, process, log_path, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited early:\n{Path(log_path).read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open:\n{Path(log_path).read_text()[-2000:]}")


def _stop(process, seconds=15):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class PgBouncer:
    """PgBouncer in front of the test database: transaction pooling, a small pool."""

    def __init__(self, database_url, pool_size=4):
        # A directory of its own under /tmp: as root PgBouncer runs as postgres, which must
        # reach its files (pytest's tmp_path is private to root).
        self.directory = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.target = make_url(database_url)
        self.port = free_port()
        self.pool_size = pool_size
        self.process = None

    @property
    def url(self):
        """The test database's URL, through PgBouncer."""
        return self.target.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def start(self):
        self.directory.mkdir(parents=True, exist_ok=True)
        user = self.target.username or "postgres"
        (self.directory / "userlist.txt").write_text(f'"{user}" ""\n')
        config = self.directory / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={self.target.host or '127.0.0.1'} port={self.target.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.directory / 'userlist.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {self.pool_size}\n"
            "max_client_conn = 400\nserver_reset_query =\n"
            # With PostgreSQL down a query waits for a server connection: fail it in seconds
            # (the service answers 503), not after the 120 s default.
            "query_wait_timeout = 5\nserver_connect_timeout = 3\nserver_login_retry = 1\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.directory / 'pgbouncer.log'}\n")
        command = [PGBOUNCER, str(config)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            shutil.chown(self.directory, "postgres")
            command[1:1] = ["-u", "postgres"]
        self.log_path = self.directory / "pgbouncer.out"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.process, self.log_path)
        return self

    def stop(self):
        if self.process is not None:
            _stop(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


class RedisClusterProcesses:
    """Three redis-server masters in cluster mode, no replicas. A master that stops leaves its
    slots without an owner; cluster-require-full-coverage no keeps the other slots served."""

    def __init__(self, directory, masters=3):
        self.directory = Path(directory)
        self.ports = [self._free_cluster_port() for _ in range(masters)]
        self.processes = {}

    @staticmethod
    def _free_cluster_port():
        """A port whose cluster bus port (port + 10000) is free as well."""
        for _ in range(50):
            port = free_port()
            bus = port + 10000
            if bus < 65536 and bus not in HANDED_OUT:
                with socket.socket() as probe:
                    try:
                        probe.bind(("127.0.0.1", bus))
                    except OSError:
                        continue
                HANDED_OUT.add(bus)  # no other server of this run may take the bus port
                return port
        raise RuntimeError("no free port pair for a Redis Cluster node")

    @property
    def url(self):
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self):
        try:
            return self._start()
        except BaseException:
            self.stop()  # the masters already started must not outlive a failed start
            raise

    def _start(self):
        self.start_nodes()
        self.create()
        return self

    def start_nodes(self):
        """The masters, cluster-enabled, before the cluster is created: they answer, and serve
        no slot."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for port in self.ports:
            log_path = self.directory / f"redis-{port}.log"
            with open(log_path, "ab") as log:
                self.processes[port] = subprocess.Popen(
                    [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                     "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                     "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
                     "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
                    stdout=log, stderr=subprocess.STDOUT)
            _wait_for_port(port, self.processes[port], log_path)
        return self

    def create(self):
        subprocess.run([REDIS_CLI, "--cluster", "create",
                        *(f"127.0.0.1:{port}" for port in self.ports),
                        "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while not all(self._state(port) == "ok" for port in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.2)
        return self

    def _state(self, port):
        info = subprocess.run([REDIS_CLI, "-p", str(port), "cluster", "info"],
                              capture_output=True, text=True, timeout=10).stdout
        return next((line.split(":", 1)[1].strip() for line in info.splitlines()
                     if line.startswith("cluster_state:")), None)

    def owner_of(self, slot):
        """The port of the master serving `slot` (from CLUSTER NODES)."""
        output = subprocess.run([REDIS_CLI, "-p", str(self.ports[0]), "cluster", "nodes"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        for line in output.splitlines():
            fields = line.split()
            for served in fields[8:]:
                start, _, end = served.partition("-")
                if start.isdigit() and int(start) <= slot <= int(end or start):
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise LookupError(slot)

    def flush(self):
        for port, process in self.processes.items():
            if process.poll() is None:
                subprocess.run([REDIS_CLI, "-p", str(port), "flushall"], capture_output=True,
                               timeout=10)

    def kill(self, port):
        self.processes[port].kill()
        self.processes[port].wait(10)

    def stop(self):
        for process in self.processes.values():
            _stop(process)


class Hosts:
    """Several gunicorn instances as one service: each read of `url` names the next one, so
    the requests of a test alternate between them (as a load balancer would send them)."""

    def __init__(self, servers):
        self.servers = servers
        self._turn = itertools.cycle(servers)
        self._lock = threading.Lock()

    @property
    def url(self):
        with self._lock:
            return next(self._turn).url
