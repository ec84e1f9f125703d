"""gunicorn settings: gunicorn -c deploy/gunicorn.conf.py wsgi:app

Every value can be overridden from the environment (GUNICORN_*, TLS_*, METRICS_*), so one file
serves the embedded single-host setup, the test suite and production. Sync workers are held by a
slow client for as long as it takes to send its request: gunicorn faces the network only through
a buffering proxy (deploy/nginx.conf; see deploy/README.md).
"""
import math
import os
import shutil
import socket
import ssl
import tempfile
from pathlib import Path

import gunicorn.http.wsgi
import gunicorn.util
from gunicorn.glogging import Logger

# Prometheus in multiprocess mode: each worker writes its samples to a shared directory that
# /metrics aggregates. prometheus_client reads this when it is first imported, which the settings
# check below does (in the master, so the workers inherit it).
# METRICS_ENABLED is read as app.config reads a flag (1/true/yes/on), which cannot be imported
# before this is set: "on" must not give each worker counters of its own.
if os.environ.get("METRICS_ENABLED", "").strip().lower() in ("1", "true", "yes", "on"):
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR",
                          tempfile.mkdtemp(prefix="intentgate-metrics-"))

from app import config as app_settings  # noqa: E402 (after PROMETHEUS_MULTIPROC_DIR)
from app import crypto, master_files  # noqa: E402
from app.context_store import taxonomy  # noqa: E402
from app.keyring import checks as key_checks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def check_app_settings():
    """Make the checks create_app makes, once in the master, so that a bad setting stops gunicorn
    with one line before any worker starts (a worker would log a traceback and be respawned)."""
    settings = app_settings.from_environment(str(ROOT / "instance"))
    app_settings.validate(settings)
    # Read here for the workers, which inherit it (app.master_files); a reload re-reads it.
    path = settings["TAXONOMY_PATH"]
    master_files.read("taxonomy", path, lambda: taxonomy.load(path))
    # And the database's key check: a ring that cannot unseal its secrets stops gunicorn here,
    # with one line, rather than every worker as it boots.
    crypto.use_local_key_if_unset(settings, str(ROOT / "instance"))
    key_checks.check_at_start(settings)


def _env_int(name, default, minimum=1):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise app_settings.ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise app_settings.ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def bind_addresses(raw):
    """GUNICORN_BIND's addresses, comma-separated: HOST:PORT ([IPv6]:PORT), unix:PATH or
    fd://N; unset or empty, the loopback default. Checked here because gunicorn reads an empty
    address (a stray comma, `GUNICORN_BIND=` in an environment file) as 0.0.0.0:8000, every
    interface, prints a traceback for a port out of range, and retries a host that does not
    resolve five times before it stops."""
    if raw is None or not raw.strip():
        return ["127.0.0.1:8000"]
    addresses = [address.strip() for address in raw.split(",")]
    for address in addresses:
        _check_bind(address, raw)
    return addresses


def _check_bind(address, raw):
    """`address` as gunicorn itself parses it (gunicorn.util.parse_address: tcp:// and the
    [IPv6] brackets included), a port required."""
    if not address:
        raise app_settings.ConfigError(
            f"GUNICORN_BIND holds an empty address (a stray comma?), got {raw!r}: gunicorn "
            "would listen on every interface")
    if address.startswith("fd://"):
        if not address[len("fd://"):].isdigit():
            raise app_settings.ConfigError(f"GUNICORN_BIND: {address}: fd:// takes a number")
        return
    try:
        parsed = gunicorn.util.parse_address(address, default_port="")  # no port: refused
    except RuntimeError:
        parsed = None
    if isinstance(parsed, str):  # unix:PATH
        directory = os.path.dirname(parsed) or "."
        if not os.path.isdir(directory):
            raise app_settings.ConfigError(
                f"GUNICORN_BIND: {address}: there is no directory {directory}")
        return
    # Digits only, where gunicorn's int() would take " 80" or "8_0"; and a host, where ":8000"
    # would be every interface.
    port_text = address.rpartition(":")[2]
    if parsed is None or not parsed[0] or not (port_text.isascii() and port_text.isdigit()):
        raise app_settings.ConfigError(
            "GUNICORN_BIND takes HOST:PORT, [IPv6]:PORT, unix:PATH or fd://N addresses "
            f"separated by commas, got {address!r}")
    host, port = parsed
    if not 1 <= port <= 65535:
        raise app_settings.ConfigError(
            f"GUNICORN_BIND: {address}: the port must be between 1 and 65535")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise app_settings.ConfigError(
            f"GUNICORN_BIND: {address}: the host {host} does not resolve") from None


def log_level():
    """GUNICORN_LOGLEVEL, one of gunicorn's levels (it takes any other for info, silently)."""
    level = (os.environ.get("GUNICORN_LOGLEVEL") or "info").strip().lower()
    if level not in Logger.LOG_LEVELS:
        raise app_settings.ConfigError(
            f"GUNICORN_LOGLEVEL must be one of {', '.join(Logger.LOG_LEVELS)}, got {level!r}")
    return level


def access_log():
    """GUNICORN_ACCESSLOG: a file gunicorn can append to, "-" for its standard output, or
    unset (none). gunicorn itself stops on a file it cannot open with three lines of its own."""
    path = (os.environ.get("GUNICORN_ACCESSLOG") or "").strip()
    if not path or path == "-":
        return path or None
    directory = os.path.dirname(os.path.abspath(path))
    writable = os.access(path, os.W_OK) if os.path.exists(path) else (
        os.path.isdir(directory) and os.access(directory, os.W_OK))
    if not writable or os.path.isdir(path):
        raise app_settings.ConfigError(f"GUNICORN_ACCESSLOG: {path} cannot be written")
    return path


def _ancestors(base, path):
    """`base/path` and each of its parents up to `base`, those that exist (nearest first)."""
    directory = base / path.strip("/")
    while True:
        if directory.is_dir():
            yield directory
        if directory == base:
            return
        directory = directory.parent


def _read(path):
    try:
        return path.read_text().split()
    except OSError:
        return None


def _v2_quota(directory):
    fields = _read(directory / "cpu.max")  # "max 100000" or "150000 100000"
    if not fields or fields[0] == "max":
        return None
    return int(fields[0]) / int(fields[1])


def _v1_quota(directory):
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if not quota or not period or int(quota[0]) <= 0:
        return None  # -1: no quota
    return int(quota[0]) / int(period[0])


def cgroup_cpu_quota(cgroup_root=CGROUP_ROOT, proc_self_cgroup=PROC_SELF_CGROUP):
    """The tightest CPU quota (in CPUs, may be fractional) on this process's cgroup and its
    parents, cgroup v2 or v1, or None when there is none. A container's `--cpus` lands here;
    os.cpu_count() still reports every core of the host."""
    quotas = []
    try:
        lines = Path(proc_self_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2 (unified)
            quotas += [_v2_quota(d) for d in _ancestors(Path(cgroup_root), path)]
        elif "cpu" in controllers.split(","):
            # v1: the controller is mounted as cpu, cpuacct or cpu,cpuacct; inside a container
            # the mount is the container's own cgroup, so the host path may not exist below it.
            for mount in {controllers, "cpu", "cpu,cpuacct"}:
                quotas += [_v1_quota(d) for d in _ancestors(Path(cgroup_root) / mount, path)]
    quotas = [quota for quota in quotas if quota is not None]
    return min(quotas, default=None)


def available_cpus(online=None, cgroup_root=CGROUP_ROOT, proc_self_cgroup=PROC_SELF_CGROUP):
    """CPUs this process may use: its affinity mask (a cpuset), capped by a cgroup CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if online is None else online
    quota = cgroup_cpu_quota(cgroup_root, proc_self_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


with app_settings.exit_on_config_error():
    check_app_settings()
    workers = _env_int("GUNICORN_WORKERS", 2 * available_cpus() + 1)
    threads = _env_int("GUNICORN_THREADS", 1)
    # Above the 30 s request budget (5 s connect + read timeout to the context store), so a slow
    # context store produces a 502 from our code rather than a worker killed mid-request.
    timeout = _env_int("GUNICORN_TIMEOUT", 40)
    # On SIGTERM: no new request is taken, in-flight requests get this long to finish, exit 0.
    graceful_timeout = _env_int("GUNICORN_GRACEFUL_TIMEOUT", 30)
    max_requests = _env_int("GUNICORN_MAX_REQUESTS", 2000, minimum=0)
    max_requests_jitter = _env_int("GUNICORN_MAX_REQUESTS_JITTER", 200, minimum=0)
    bind = bind_addresses(os.environ.get("GUNICORN_BIND"))
    preload_app = app_settings.flag("GUNICORN_PRELOAD", False)
    loglevel = log_level()
    # The app writes one JSON line per request itself; this adds gunicorn's own view when wanted.
    accesslog = access_log()

# gunicorn's sync and gthread workers, answering in JSON where gunicorn answers (app.workers).
worker_class = ("app.workers.JsonErrorsThreadWorker" if threads > 1
                else "app.workers.JsonErrorsSyncWorker")
keepalive = 5
control_socket_disable = True
errorlog = "-"
# Its atoms masked and escaped as JSON string content (app.logs.JsonAccessAtoms): a key in the
# path or a %0a decoded into it must not reach the log as it came.
logger_class = "app.logs.GunicornLogger"
access_log_format = (
    '{"time": "%(t)s", "logger": "gunicorn.access", "pid": "%(p)s", "remote": "%(h)s", '
    '"method": "%(m)s", "path": "%(U)s", "status": %(s)s, "bytes": "%(B)s", '
    '"duration_us": %(D)s, "request_id": "%({x-request-id}o)s"}'
)

# Forwarded headers are the app's business alone (TRUSTED_PROXY_HOPS, Werkzeug's ProxyFix).
# gunicorn would let any peer in forwarded_allow_ips (127.0.0.1 by default, or the
# FORWARDED_ALLOW_IPS variable) turn plain HTTP into HTTPS with X-Forwarded-Proto and friends
# (secure_scheme_headers) and set SCRIPT_NAME or PATH_INFO (forwarder_headers), and it trusts
# Unix-socket peers whatever that list says: so trust no peer and honour no such header.
forwarded_allow_ips = ""
secure_scheme_headers = {}
forwarder_headers = ""
# The PROXY protocol would let a peer choose the client address: off, and no peer allowed.
proxy_protocol = "off"
proxy_allow_ips = ""

# TLS 1.3 only, when gunicorn terminates TLS itself: for the hop from the proxy in front of it
# (deploy/README.md); it is not a way to face clients without one.
certfile = os.environ.get("TLS_CERTFILE") or None
keyfile = os.environ.get("TLS_KEYFILE") or None


def tls_context(certificate, key):
    """The context gunicorn serves TLS with, as its own default builds it (TLS 1.3 only): a
    missing or unreadable file, or a key that does not match, stops gunicorn with one line,
    where gunicorn would start, log "Listening at: https://" and fail every handshake (or print
    a traceback). Built here in the master, once, for the workers to inherit
    (app.master_files): gunicorn would build it anew at every connection."""
    if certificate is None:
        if key is not None:
            raise app_settings.ConfigError("TLS_KEYFILE is set without TLS_CERTFILE")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        context.load_cert_chain(certificate, key)
    except (OSError, ssl.SSLError) as exc:
        raise app_settings.ConfigError(
            "TLS_CERTFILE and TLS_KEYFILE must name a readable PEM certificate and its private "
            f"key ({type(exc).__name__}: {exc.strerror or exc})") from None
    return context


with app_settings.exit_on_config_error():
    _tls_context = master_files.read("TLS pair", (certfile, keyfile),
                                     lambda: tls_context(certfile, keyfile))


# No server software or version in `Server` (CONTRACT.md, Wire format). gunicorn names itself
# in every response it writes and has no setting for it; its Response reads this module global
# when each response is made, and the workers fork after this file is read.
gunicorn.http.wsgi.SERVER = "intentgate"


def ssl_context(conf, default_ssl_context_factory):
    return _tls_context  # the master's (above), for every connection of every worker


def on_starting(server):
    # Started: from now on a reload (SIGHUP re-runs this file in the running master) logs what
    # it finds wrong instead of exiting (gunicorn would stop, and its workers with it): a ring
    # lacking a key another process seals with (app.keyring.checks), as a recycled worker does;
    # a TLS pair or a taxonomy it cannot read, keeping the one read before (app.master_files).
    master_files.master_started()
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)


def post_fork(server, worker):
    # With preload_app the app (and its connection pools) was built in the master: give each
    # worker fresh connections instead of sharing the master's sockets.
    if server.cfg.preload_app:
        from app.extensions import db

        flask_app = server.app.wsgi()
        with flask_app.app_context():
            db.engine.dispose(close=False)
            flask_app.extensions["database"].engine.dispose(close=False)  # the request path's


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
