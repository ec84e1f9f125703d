"""gunicorn's workers (deploy/gunicorn.conf.py names them), answering in the contract's JSON when
gunicorn itself answers: a request it cannot parse (the app never sees it), a worker stopped in
the middle of a request (its timeout).

gunicorn's own answer is an HTML page that quotes the bad request line, and its log line quotes
it too: a key sent in a query string would reach both. These answers and log lines name the
kind of failure only, and carry a request id like every other answer (CONTRACT.md, Wire
format)."""
import json
import os
import select
import traceback
import uuid
from ssl import SSLError

from gunicorn import util
from gunicorn.http.errors import (
    ChunkMissingTerminator,
    ExpectationFailed,
    ForbiddenProxyRequest,
    InvalidChunkExtension,
    InvalidChunkSize,
    InvalidH2CPreface,
    InvalidHeader,
    InvalidHeaderName,
    InvalidHTTPVersion,
    InvalidProxyLine,
    InvalidRequestLine,
    InvalidRequestMethod,
    InvalidSchemeHeaders,
    LimitRequestHeaders,
    LimitRequestLine,
    ObsoleteFolding,
    UnsupportedTransferCoding,
)
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

from app.http import UNSUPPORTED_CODING, acceptable_request_id

MALFORMED = (400, "Bad Request", "malformed HTTP request")
# What gunicorn refuses, as (status, reason, error text); the first class that matches wins.
REFUSALS = (
    (LimitRequestLine, (414, "URI Too Long", "request line too long")),
    (LimitRequestHeaders, (431, "Request Header Fields Too Large", "request headers too large")),
    (ExpectationFailed, (417, "Expectation Failed", "expectation not supported")),
    (UnsupportedTransferCoding, (501, "Not Implemented", UNSUPPORTED_CODING)),
    ((ForbiddenProxyRequest, SSLError), (403, "Forbidden", "forbidden")),
    ((InvalidRequestLine, InvalidRequestMethod, InvalidHTTPVersion, InvalidHeader,
      InvalidHeaderName, InvalidProxyLine, InvalidSchemeHeaders, ObsoleteFolding,
      InvalidH2CPreface, InvalidChunkSize, ChunkMissingTerminator, InvalidChunkExtension),
     MALFORMED),
)
FAILED = (500, "Internal Server Error", "internal server error")


def describe(exc):
    """(status, reason, error text) for what gunicorn met; anything it did not refuse as the
    client's fault (a misconfiguration, a worker stopped mid-request) is a 500."""
    for kinds, answer in REFUSALS:
        if isinstance(exc, kinds):
            return answer
    return FAILED


def error_answer(status, reason, error, request_id):
    body = json.dumps({"error": error, "request_id": request_id}).encode("ascii")
    head = (f"HTTP/1.1 {status} {reason}\r\n"
            "Connection: close\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-Request-Id: {request_id}\r\n"
            "X-Content-Type-Options: nosniff\r\n"
            "Cache-Control: no-store\r\n\r\n")
    return head.encode("ascii") + body


class JsonErrors:
    """Replaces gunicorn's Worker.handle_error (it writes HTML and logs the request line)."""

    def handle_error(self, req, client, addr, exc):
        answer = describe(exc)
        status, reason, error = answer
        request_id = _caller_request_id(req) or uuid.uuid4().hex
        if answer is FAILED:
            # Where it failed, but not the exception's text, which may quote the request.
            self.log.error("request failed in the server: %s (status %d, request_id %s)\n%s",
                           type(exc).__name__, status, request_id,
                           "".join(traceback.format_tb(exc.__traceback__)),
                           extra={"request_id": request_id, "status": status})
        else:
            self.log.warning("request refused by the server: %s (status %d, request_id %s)",
                             type(exc).__name__, status, request_id,
                             extra={"request_id": request_id, "status": status})
        try:
            util.write_nonblock(client, error_answer(status, reason, error, request_id))
        except Exception:  # noqa: BLE001 - the client may be gone; gunicorn ignores this too
            self.log.debug("Failed to send error message.")


def _caller_request_id(req):
    """The caller's X-Request-Id when gunicorn had parsed the headers (a worker stopped in the
    middle of a request) and the app would have echoed it; None otherwise."""
    for name, value in getattr(req, "headers", None) or ():
        if name == "X-REQUEST-ID":
            return value if acceptable_request_id(value) else None
    return None


class JsonErrorsSyncWorker(JsonErrors, SyncWorker):
    """gunicorn's sync worker (GUNICORN_THREADS=1), with JsonErrors' answers, and one idle
    worker woken per connection rather than all of them.

    gunicorn's sync workers wait for a connection in select() on the listening sockets they
    share, and the kernel wakes every waiter for each connection: all but one find nothing to
    accept and wait again, each having spent a wake-up, a heartbeat and a failed accept(). Here
    each worker waits in an epoll set of its own holding the listeners with EPOLLEXCLUSIVE,
    which wakes one worker that is waiting (the kernel's own choice: in practice the same worker
    while it keeps up, whose code and data are then still in the CPU's caches), so an idle
    worker costs nothing per request. Without EPOLLEXCLUSIVE (not Linux 4.5 or later), gunicorn's
    own wait."""

    _poller = None  # this worker's epoll set, made on its first wait (after the fork)
    _listeners = {}  # fd -> listening socket, as gunicorn's wait returns them

    def wait(self, timeout):
        if self._poller is None:
            self._poller = self._exclusive_poller()
        if not self._poller:
            return super().wait(timeout)
        self.notify()
        ready = []
        for fd, _ in self._poller.poll(timeout):
            if fd == self.PIPE[0]:
                os.read(fd, 1)  # a signal's wake-up byte, as gunicorn's wait reads it
                ready.append(fd)
            else:
                ready.append(self._listeners[fd])
        return ready

    def _exclusive_poller(self):
        """This worker's epoll set (listeners exclusive, the wake-up pipe not), or False."""
        exclusive = getattr(select, "EPOLLEXCLUSIVE", None)
        if exclusive is None:
            return False
        poller = select.epoll()
        try:
            for listener in self.sockets:
                poller.register(listener.fileno(), select.EPOLLIN | exclusive)
        except OSError:  # a kernel without it refuses the flag
            poller.close()
            return False
        poller.register(self.PIPE[0], select.EPOLLIN)
        self._listeners = {listener.fileno(): listener for listener in self.sockets}
        return poller


class JsonErrorsThreadWorker(JsonErrors, ThreadWorker):
    """gunicorn's gthread worker (GUNICORN_THREADS above 1), with JsonErrors' answers, and
    stopping once however many quit signals arrive."""

    _quitting = False

    def handle_quit(self, sig, frame):
        # Ctrl-C reaches a worker twice (SIGINT from the terminal, SIGQUIT from the master).
        # gunicorn's handler shuts the thread pool down under a lock that is not reentrant: a
        # second signal handled inside the first deadlocked the worker until the master killed
        # it (graceful_timeout, 30 s). The first handler finishes the job.
        if self._quitting:
            return
        self._quitting = True
        super().handle_quit(sig, frame)
