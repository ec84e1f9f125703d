"""One JSON object per log line, each carrying the request id of the request that wrote it."""
import json
import logging
import re
import sys
import time
from contextlib import contextmanager

from flask import g, has_request_context, request
from gunicorn.glogging import Logger


access_log = logging.getLogger("app.access")
# A credential a client put in a URL (DELETE /v1/tenant/keys/key_live_...): an API key or signing
# secret (hex) up to the end of its path segment or query parameter; a webhook secret (base64,
# which may hold "/") up to the end of its parameter or of the path, whatever follows it there.
# In any case: a key upper-cased on the way is no key the service takes, but still a secret.
_CREDENTIAL_IN_URL = re.compile(r"((?:key|sig)_live_)[^/?&\s]*|(whsec_)[^?&\s]*", re.IGNORECASE)


def mask_credentials(text):
    """`text` (a path or query string) with each key or secret in it masked."""
    folded = text.lower()
    if "_live_" in folded or "whsec_" in folded:  # on every request: the pattern only if needed
        return _CREDENTIAL_IN_URL.sub(r"\1\2[redacted]", text)
    return text


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


# Attributes every LogRecord has; any other attribute came from `extra=` and is a field.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "request_id"}
# One encoder for every line: json.dumps given default= builds a new one at every call (11 K of
# a verify's 2.1 M instructions, bench/instructions.py).
_LINE_ENCODER = json.JSONEncoder(default=str)


class JsonLineFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, pid, message, request_id, then the
    `extra=` fields, and exc_info / stack_info as text when present.

    Written here rather than taken from python-json-logger: the access line is written on
    every request, and that library's generic field handling made it the largest single
    after-request cost in the profile (about 150 Python calls a line)."""

    def format(self, record):
        line = {"time": self.formatTime(record), "level": record.levelname,
                "logger": record.name, "pid": record.process, "message": record.getMessage(),
                "request_id": getattr(record, "request_id", None)}
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES:
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return _LINE_ENCODER.encode(line)

    def formatTime(self, record, datefmt=None):
        """logging's own format, with the second's text made once a second, not once a line."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, text = self._second
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(second))
            self._second = second, text  # one assignment: threads see a pair that agrees
        return self.default_msec_format % (text, record.msecs)

    _second = (None, "")


def init_app(app):
    # Our lines carry no file, line, thread or process name, so logging need not gather them
    # for every record (the logging HOWTO's "Optimization" section); the pid stays.
    logging._srcfile = None  # pylint: disable=protected-access
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = StderrHandler()
    handler.setFormatter(JsonLineFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    # Replace, not add: create_app runs once per test and handlers must not pile up.
    for existing in list(root.handlers):
        if getattr(existing, "_intentgate", False):
            root.removeHandler(existing)
    handler._intentgate = True
    root.addHandler(handler)
    root.setLevel(app.config["LOG_LEVEL"])
    # Flask-Limiter says "ratelimit ... exceeded" at INFO for every refused request: the access
    # line says it already (429), and a flood of them doubled the log.
    logging.getLogger("flask-limiter").setLevel(logging.WARNING)


def log_request(response):
    """One JSON line per request: what was asked, how it ended, and what it decided."""
    # Each proxy looked through once: this runs on every request.
    state, asked = g._get_current_object(), request._get_current_object()
    elapsed_ms = (time.perf_counter() - state.get("request_started", time.perf_counter())) * 1000
    # The path, never the query string, and a key or secret in the path masked: keys must not
    # travel in URLs, and if a client puts one there anyway it must not reach the log.
    fields = {"method": asked.method, "path": mask_credentials(asked.path),
              "status": response.status_code,
              "duration_ms": round(elapsed_ms, 2)}
    for name in ("verdict", "intent_class"):
        value = state.get(name)
        if value is not None:
            fields[name] = value
    access_log.info("request", extra=fields)
    return response


class JsonAccessAtoms(dict):
    """gunicorn's access-log atoms, each text read as the inside of a JSON string (the format in
    deploy/gunicorn.conf.py quotes them): credentials masked as in the app's line, quotes,
    backslashes and control characters escaped, so that a %0a or %00 in a path can neither break
    the line nor reach the log raw. An atom the request lacks is "-", as in gunicorn's own."""

    def __getitem__(self, name):
        value = self.get(name.lower() if name.startswith("{") else name, "-")
        if isinstance(value, str):
            return json.dumps(mask_credentials(value))[1:-1]
        return value


class GunicornLogger(Logger):
    """gunicorn's logger (deploy/gunicorn.conf.py's logger_class): its own lines (starting,
    workers booted and stopped, requests it refused) in the app's form, one JSON object a line,
    and its access line escaped."""

    atoms_wrapper_class = JsonAccessAtoms

    def _set_handler(self, log, output, fmt, stream=None):
        if log is self.error_log:
            fmt = JsonLineFormatter()
        super()._set_handler(log, output, fmt, stream)


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
