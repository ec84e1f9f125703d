"""One JSON object per log line, each carrying the request id of the request that wrote it."""
import logging
import sys

from flask import g, has_request_context
from pythonjsonlogger.json import JsonFormatter


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
