"""One JSON object per log line, each carrying the request id of the request that wrote it."""
import logging
import sys
import time
from contextlib import contextmanager

from flask import g, has_request_context, request
from pythonjsonlogger.json import JsonFormatter


access_log = logging.getLogger("app.access")


class StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (gunicorn and pytest both replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        """Ignored: the stream is looked up on every write."""


class RequestIdFilter(logging.Filter):
    def filter(self, record):
        record.request_id = g.get("request_id") if has_request_context() else None
        return True


def init_app(app):
    handler = StderrHandler()
    handler.setFormatter(
        JsonFormatter(
            "{asctime}{levelname}{name}{process}{message}{request_id}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger",
                           "process": "pid"},
        )
    )
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    # Replace, not add: create_app runs once per test and handlers must not pile up.
    for existing in list(root.handlers):
        if getattr(existing, "_intentgate", False):
            root.removeHandler(existing)
    handler._intentgate = True
    root.addHandler(handler)
    root.setLevel(app.config["LOG_LEVEL"])


def log_request(response):
    """One JSON line per request: what was asked, how it ended, and what it decided."""
    elapsed_ms = (time.perf_counter() - g.get("request_started", time.perf_counter())) * 1000
    # The path, never the query string: keys must not travel in URLs, and if a client puts one
    # there anyway it must not reach the log.
    fields = {"method": request.method, "path": request.path, "status": response.status_code,
              "duration_ms": round(elapsed_ms, 2)}
    for name in ("verdict", "intent_class"):
        value = g.get(name)
        if value is not None:
            fields[name] = value
    access_log.info("request", extra=fields)
    return response


@contextmanager
def only_failures():
    """While a CLI command runs for a person: this module's handler shows warnings and errors."""
    handlers = [h for h in logging.getLogger().handlers if getattr(h, "_intentgate", False)]
    levels = [handler.level for handler in handlers]
    for handler in handlers:
        handler.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for handler, level in zip(handlers, levels):
            handler.setLevel(level)
