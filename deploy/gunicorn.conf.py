"""gunicorn settings: gunicorn -c deploy/gunicorn.conf.py wsgi:app

Every value can be overridden from the environment (GUNICORN_*), so one file serves the
embedded single-host setup, the test suite and production.
"""
import multiprocessing
import os


def _env_int(name, default):
    return int(os.environ.get(name, default))


bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000").split(",")
workers = _env_int("GUNICORN_WORKERS", 2 * multiprocessing.cpu_count() + 1)
threads = _env_int("GUNICORN_THREADS", 1)
worker_class = "gthread" if threads > 1 else "sync"
# Above the 30 s request budget (5 s connect + read timeout to the context store), so a slow
# context store produces a 502 from our code rather than a worker killed mid-request.
timeout = _env_int("GUNICORN_TIMEOUT", 40)
graceful_timeout = _env_int("GUNICORN_GRACEFUL_TIMEOUT", 30)
keepalive = 5
max_requests = _env_int("GUNICORN_MAX_REQUESTS", 2000)
max_requests_jitter = _env_int("GUNICORN_MAX_REQUESTS_JITTER", 200)
# The app is built in each worker after the fork: engines, Redis and HTTP pools are never shared.
preload_app = False
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")
