"""gunicorn settings: gunicorn -c deploy/gunicorn.conf.py wsgi:app

Every value can be overridden from the environment (GUNICORN_*, TLS_*, METRICS_*), so one file
serves the embedded single-host setup, the test suite and production.
"""
import multiprocessing
import os
import shutil
import ssl
import tempfile


def _env_int(name, default):
    return int(os.environ.get(name, default))


bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000").split(",")
workers = _env_int("GUNICORN_WORKERS", 2 * multiprocessing.cpu_count() + 1)
threads = _env_int("GUNICORN_THREADS", 1)
worker_class = "gthread" if threads > 1 else "sync"
# Above the 30 s request budget (5 s connect + read timeout to the context store), so a slow
# context store produces a 502 from our code rather than a worker killed mid-request.
timeout = _env_int("GUNICORN_TIMEOUT", 40)
# On SIGTERM: listeners close at once, in-flight requests get this long to finish, exit 0.
graceful_timeout = _env_int("GUNICORN_GRACEFUL_TIMEOUT", 30)
keepalive = 5
max_requests = _env_int("GUNICORN_MAX_REQUESTS", 2000)
max_requests_jitter = _env_int("GUNICORN_MAX_REQUESTS_JITTER", 200)
preload_app = os.environ.get("GUNICORN_PRELOAD", "false").lower() == "true"
control_socket_disable = True
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")
# The app writes one JSON line per request itself; this adds gunicorn's own view when wanted.
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
access_log_format = (
    '{"time": "%(t)s", "logger": "gunicorn.access", "pid": "%(p)s", "remote": "%(h)s", '
    '"method": "%(m)s", "path": "%(U)s", "status": %(s)s, "bytes": "%(B)s", '
    '"duration_us": %(D)s, "request_id": "%({x-request-id}o)s"}'
)

# TLS terminated by gunicorn itself: TLS 1.3 only.
certfile = os.environ.get("TLS_CERTFILE") or None
keyfile = os.environ.get("TLS_KEYFILE") or None


def ssl_context(conf, default_ssl_context_factory):
    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


# Prometheus in multiprocess mode: each worker writes its samples to a shared directory that
# /metrics aggregates. Set before any worker imports prometheus_client.
if os.environ.get("METRICS_ENABLED", "false").lower() == "true":
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="intentgate-metrics-"))


def on_starting(server):
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


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
