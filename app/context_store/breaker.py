"""A context store that does not answer must not hold every worker.

A call that times out (the connect timeout, the read timeout, the total deadline) holds its
worker for up to CONTEXT_STORE_DEADLINE; with the store hung, every generate would, and a sync
worker serves nothing else meanwhile: verify, usage and /health would queue behind them on
every host. So after such a call this worker answers generate 502 at once, without asking
the store, for CONTEXT_STORE_BREAK_SECONDS. Then one request tries the store again (the
others still fail fast): an answer of any kind closes the breaker; another timeout opens it
for twice as long, up to MAX_BREAK_SECONDS. A store that hangs thus costs each worker one
timeout a minute at most, and one that blipped costs a few seconds of 502s.

A quick failure (refused, 5xx, a malformed answer) holds no one and opens nothing; one that
took CONTEXT_STORE_CONNECT_TIMEOUT or longer (a 504 after 19 s; a 4xx, one token refused,
aside) held its worker as a timeout does, and counts as one. The state is this process's
own, like the rate-limit store's breaker (app.traffic.strategy): it decides nothing but
whether this worker waits, and each worker learns the store's state itself.
"""
import threading
import time

from app.config import CONTEXT_STORE_MAX_BREAK_SECONDS as MAX_BREAK_SECONDS
CLOSED, TRIAL = "closed", "trial"  # what `allow` admitted a call as


class Breaker:
    def __init__(self, seconds):
        self.seconds = seconds  # the first break
        self._lock = threading.Lock()  # gthread workers: one trial at a time
        self._opened_at = None
        self._break = 0.0
        self._trial = False

    def allow(self):
        """Whether this request may ask the store: CLOSED (yes), TRIAL (yes: the one request
        that tries the store once the break is over) or None (no: answer 502 at once)."""
        with self._lock:
            if self._opened_at is None:
                return CLOSED
            # The wall clock (tests travel in time); set back, it ends the break early rather
            # than prolong it.
            now = time.time()
            if self._trial or self._opened_at <= now < self._opened_at + self._break:
                return None
            self._trial = True
            return TRIAL

    def answered(self):
        """The store answered, or failed without holding the call: closed."""
        with self._lock:
            self._opened_at, self._break, self._trial = None, 0.0, False

    def timed_out(self, admitted):
        """A call `allow` admitted as `admitted` did not get an answer in time. The first such
        call opens the breaker for the first break; a failed trial doubles it. Calls that were
        already in flight when it opened (a gthread worker's others) change nothing: one
        blip must not double the break once per thread. Returns the break's seconds."""
        with self._lock:
            if admitted == TRIAL:
                self._break = min(self._break * 2, MAX_BREAK_SECONDS)
                self._opened_at, self._trial = time.time(), False
            elif self._opened_at is None:
                self._break, self._opened_at = self.seconds, time.time()
            return self._break
