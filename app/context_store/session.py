"""The one configured HTTP session through which the service calls the context store.

requests' timeouts bound each socket operation, not the call: a store that sends a byte every few
seconds would hold a request for ever. Here every call has one total deadline instead. Each read
from the socket, for the status line, the headers and the body alike, waits at most until that
deadline, and the answer is read no further than MAX_ANSWER_BYTES + 1.
"""
import contextvars
import http.client
import io
import os
import time

import requests
from flask import current_app
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ReadTimeoutError

from app.context_store.breaker import Breaker

MAX_ANSWER_BYTES = 64 * 1024

# The deadline of the call this thread is making; read by the socket reader below, which
# http.client creates deep inside requests, where no argument can reach it.
_current_deadline = contextvars.ContextVar("context_store_deadline", default=None)


class DeadlineExceeded(Exception):
    """The call did not finish within CONTEXT_STORE_DEADLINE."""


class AnswerTooLarge(Exception):
    """The store's answer is longer than MAX_ANSWER_BYTES."""


class _Deadline:
    def __init__(self, seconds):
        self.at = time.monotonic() + seconds
        self.passed = False


class _DeadlineReader(io.RawIOBase):
    """A socket file whose every read waits no longer than the call's deadline."""

    def __init__(self, sock, raw, deadline):
        super().__init__()
        self._sock, self._raw, self._deadline = sock, raw, deadline
        self._read_timeout = sock.gettimeout()  # urllib3 sets the read timeout before this

    def readable(self):
        return True

    def readinto(self, buffer):
        if self._deadline is None:
            return self._raw.readinto(buffer)
        remaining = self._deadline.at - time.monotonic()
        if remaining <= 0:
            self._deadline.passed = True
            raise TimeoutError("context store deadline passed")
        bounded_by_deadline = self._read_timeout is None or remaining < self._read_timeout
        self._sock.settimeout(remaining if bounded_by_deadline else self._read_timeout)
        try:
            return self._raw.readinto(buffer)
        except TimeoutError:
            self._deadline.passed = self._deadline.passed or bounded_by_deadline
            raise
        finally:
            # A pooled connection is reused by the next call: leave no shortened timeout behind.
            self._sock.settimeout(self._read_timeout)

    def close(self):
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        # Nothing has been read yet, so the buffered file can be swapped for one over our reader.
        self.fp = io.BufferedReader(
            _DeadlineReader(sock, self.fp.detach(), _current_deadline.get())
        )


class _HTTPConnection(HTTPConnection):
    response_class = _DeadlineResponse


class _HTTPSConnection(HTTPSConnection):
    response_class = _DeadlineResponse


class _HTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _DeadlineAdapter(HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _HTTPConnectionPool, "https": _HTTPSConnectionPool,
        }


class ContextStoreSession:
    """Holds a pooled requests.Session per process, made on first use after gunicorn forks."""

    def __init__(self):
        self._session = None
        self._pid = None

    def init_app(self, app):
        app.extensions["context_store"] = self
        app.extensions["context_store_breaker"] = Breaker(
            app.config["CONTEXT_STORE_BREAK_SECONDS"])

    @property
    def session(self):
        if self._session is None or self._pid != os.getpid():
            session = requests.Session()
            # No automatic retries: a retry would double the time budget of one request.
            adapter = _DeadlineAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            session.headers["User-Agent"] = "intentgate-context-client/1"
            # An answer is at most 64 KiB: compression saves nothing and would let a few
            # bytes on the wire unpack into many.
            session.headers["Accept-Encoding"] = "identity"
            session.trust_env = False
            self._session, self._pid = session, os.getpid()
        return self._session

    def post(self, url, **kwargs):
        """POST within the deadline; return the status and the body of a 2xx answer (else b"")."""
        config = current_app.config
        seconds = config["CONTEXT_STORE_DEADLINE"]
        timeout = (min(config["CONTEXT_STORE_CONNECT_TIMEOUT"], seconds),
                   config["CONTEXT_STORE_READ_TIMEOUT"])
        deadline = _Deadline(seconds)
        token = _current_deadline.set(deadline)
        try:
            # A redirect is an answer like any other non-2xx: following it would send the
            # user's token to another address, and spend the request's budget on a second call.
            with self.session.post(url, timeout=timeout, stream=True, allow_redirects=False,
                                   **kwargs) as response:
                if not 200 <= response.status_code < 300:
                    return response.status_code, b""
                return response.status_code, _bounded_body(response)
        except requests.RequestException:
            if deadline.passed:
                raise DeadlineExceeded from None
            raise
        finally:
            _current_deadline.reset(token)


def _bounded_body(response):
    # A read of n bytes returns n unless the answer ended, so this reads at most
    # MAX_ANSWER_BYTES + 1 bytes; leaving the loop early closes the connection.
    body = b""
    try:
        for chunk in response.iter_content(MAX_ANSWER_BYTES + 1):
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise AnswerTooLarge
    except requests.ConnectionError as exc:
        # requests reports a read timeout within the body as a ConnectionError (its
        # iter_content): it is the store falling silent after its headers, a timeout.
        if exc.args and isinstance(exc.args[0], ReadTimeoutError):
            raise requests.ReadTimeout(*exc.args, response=response) from None
        raise
    return body
