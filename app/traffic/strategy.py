"""The contract's token bucket as a `limits` strategy, registered as "token-bucket".

An item "100 per 60 seconds" is a bucket of 100 tokens refilling 100 every 60 seconds. The
bucket lives in the limiter's storage: on Redis (single, Cluster or Sentinel) one Lua script,
run as one EVALSHA through the client the `limits` storage holds, on Redis's clock (its one key
names one hash slot); on any other storage through its `take_token`/`peek_tokens` (the embedded
setup's database storage, app.traffic.storage). limits' own proposal for a token bucket
(limits PR #364) has the same four methods, so this can give way to it when it ships.

A store that does not answer costs a worker one timeout, then none while it stays down: after a
failure the strategy raises StoreUnavailable at once, without asking the store (the circuit
breaker is open), and a thread of the worker asks the store once a second whether it answers
again, closing the breaker when it does. No request waits for a store that is known to be down
(CONTRACT.md: under a frozen store every answer comes within 50 ms after the first). On a Redis
Cluster the breaker is per master: one that is down takes only its own slots' buckets with it,
the others keep answering.
"""
import contextvars
import hashlib
import logging
import math
import os
import threading
import time
import weakref

import hiredis
import redis
from limits.limits import Granularity, RateLimitItem
from limits.storage import RedisClusterStorage, RedisStorage
from limits.strategies import STRATEGIES, RateLimiter
from limits.util import WindowStats
from redis.exceptions import NoScriptError, RedisClusterException, ResponseError

log = logging.getLogger(__name__)

# KEYS[1] bucket; ARGV capacity, refill per second. Leaves `tokens` as the bucket holds now.
_REFILL_LUA = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
"""
# Returns the tokens as a string, spending none and writing nothing.
PEEK_LUA = _REFILL_LUA + "return tostring(tokens)\n"
# Returns {allowed, tokens left as string}.
TAKE_LUA = _REFILL_LUA + """local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity / rate) * 1000) + 1000)
return {allowed, tostring(tokens)}
"""

BREAKER_SECONDS = 1.0
_KEYS_KEPT = 10_000  # the buckets' keys the strategy remembers (a few MB at most)


class StoreUnavailable(Exception):
    """The rate-limit store did not answer (or did not answer within the last second)."""


class Bucket(WindowStats):
    """What a bucket holds: limits' (reset_time, remaining), plus the tokens and refill rate the
    contract's Retry-After is computed from."""

    tokens: float
    rate: float

    def __new__(cls, tokens, capacity, rate, now):
        bucket = super().__new__(cls, math.ceil(now + (capacity - tokens) / rate),
                                 int(math.floor(tokens)))
        bucket.tokens, bucket.rate = tokens, rate
        return bucket

    @property
    def retry_after(self):
        return max(1, math.ceil((1 - self.tokens) / self.rate))


class _RedisTokens:
    """take/peek as one EVALSHA through the storage's own client and pool (prefixed as its keys
    are).

    On one node (or a Sentinel's master) each thread sends its scripts on one connection of its
    own, taken from the storage's pool on first use and kept, packed by hiredis and written and
    read with the connection's own methods: a pool checkout and release around every command, then
    redis-py's per-command retry, lock and metrics bookkeeping (none of which applies: no
    retries are configured, the connection is this thread's alone, and a failure goes to the
    breaker), were most of the limiter's Python in the profile. One per thread, not one per
    worker shared by its threads: while Redis does not answer, each thread would wait its turn
    and then its own timeout. It connects on first use in the process that uses it (gunicorn
    forks workers from the master that built the app; a socket must not be shared across
    processes), so an app starts while Redis is down; a connection that fails is dropped, and
    the next command connects afresh (to the master a Sentinel names now). A cluster client
    routes each command to its slot's master itself, and is used as it is."""

    def __init__(self, storage):
        self.storage = storage
        self.cluster = isinstance(storage, RedisClusterStorage)
        self._cluster_scripts = {}  # made on first use: the client may not be (app.traffic.cluster)
        self._own = threading.local()

    def take_token(self, key, capacity, rate):
        allowed, tokens = self._run(TAKE_LUA, key, capacity, rate)
        return bool(allowed), float(tokens)

    def peek_tokens(self, key, capacity, rate):
        return float(self._run(PEEK_LUA, key, capacity, rate))

    def execute(self, *command):
        """Another caller's command, sent as the scripts are (a cluster client routes it by its
        key): app.tenants.key_cache's GET, SET and DEL of a principal. Through redis-py's
        client these were a pool checkout, a readiness poll and its bookkeeping each, more
        Python than the command (bench/profile.py)."""
        if self.cluster:
            return self.storage.get_connection().execute_command(*command)
        return _exchange(self._connection(), command)

    def _run(self, script, key, capacity, rate):
        key = self.storage.prefixed_key(key)
        if self.cluster:
            registered = self._cluster_scripts.get(script)
            if registered is None:
                registered = self._cluster_scripts[script] = (
                    self.storage.get_connection().register_script(script))
            return registered(keys=[key], args=[capacity, rate])
        connection = self._connection()
        try:
            return _exchange(connection, (b"EVALSHA", _SHA1[script], 1, key, capacity, rate))
        except NoScriptError:  # a Redis restarted or failed over: EVAL caches it again
            return _exchange(connection, (b"EVAL", script, 1, key, capacity, rate))

    def _connection(self):
        """This thread's connection, connected and checked as the pool does when it hands one
        out: connect() is the connection's own (a Sentinel's asks for the master now; sending
        on an unconnected one would not), then _check."""
        own = self._own
        if getattr(own, "pid", None) != os.getpid():
            own.connection = self.storage.get_connection().connection_pool.make_connection()
            own.pid = os.getpid()
        connection = own.connection
        connection.connect()  # nothing to do once connected
        _check(connection)
        return connection

    def masters_answer(self, node):
        """On a cluster: whether master `node` (every master for None) answers a PING now,
        through the cluster client: the breaker's thread asks, not a request."""
        try:
            if node is None:
                return not self.silent_masters()
            client = self.storage.get_connection()
            return bool(client.ping(target_nodes=client.get_node(node_name=node)))
        except (redis.RedisError, RedisClusterException, OSError):
            return False

    def silent_masters(self):
        """On a cluster: the names of the masters that do not answer a PING now, each asked
        on its own (a frozen one costs its timeout); RedisClusterException while there is no
        client (app.traffic.cluster)."""
        client = self.storage.get_connection()
        silent = []
        for primary in client.get_primaries():
            try:
                client.ping(target_nodes=primary)
            except (redis.RedisError, OSError):
                silent.append(primary.name)
        return silent

    def node_of(self, key):
        """The cluster master that holds `key` (its breaker's name); one store otherwise."""
        if not self.cluster:
            return None
        try:
            client = self.storage.get_connection()
            return client.get_node_from_key(self.storage.prefixed_key(key)).name
        except RedisClusterException:
            # A slot no master covers now, or no client yet (app.traffic.cluster): the call
            # will find out, and its failure is the whole store's.
            return None


_SHA1 = {script: hashlib.sha1(script.encode()).hexdigest() for script in (TAKE_LUA, PEEK_LUA)}


def _exchange(connection, command):
    """Send `command` and read its reply. Packed by hiredis itself, as redis-py's send_command
    would, without its Python wrapper."""
    try:
        connection.send_packed_command([hiredis.pack_command(command)])
        return connection.read_response()
    except ResponseError:
        raise  # the reply was read whole: the connection is fine
    except BaseException:
        connection.disconnect()  # a reply may be left unread: never reuse it
        raise


def _check(connection):
    """What the pool checks when it hands out a connection: one that the server closed (Redis
    restarted) or that holds an unread reply is dropped, and the next command connects afresh
    instead of failing."""
    try:
        if connection.can_read():
            connection.disconnect()
    except (OSError, redis.RedisError):  # a socket's errors and redis-py's own
        connection.disconnect()


def _one_store(_key):
    return None


class TokenBucketRateLimiter(RateLimiter):
    """hit spends a token, test and get_window_stats read the bucket without spending."""

    def __init__(self, storage):
        super().__init__(storage)
        self.tokens = _RedisTokens(storage) if isinstance(storage, RedisStorage) else storage
        self._node_of = getattr(self.tokens, "node_of", _one_store)
        self.errors = storage.base_exceptions
        # Open breakers: node (None: the one store) -> the thread asking it whether it answers.
        self._open = {}
        self._lock = threading.Lock()
        # What this context's last call learnt of each bucket: the rate headers after a hit
        # read it instead of asking the store a second time. forget() at the request's end.
        self._seen = contextvars.ContextVar("token_bucket_seen", default=None)
        self._keys = {}  # (id(item), identifiers) -> (item, key): see _key

    def hit(self, item, *identifiers, cost=1):
        key = self._key(item, identifiers)
        capacity, rate = _shape(item)
        allowed, tokens = self._ask(self.tokens.take_token, key, capacity, rate)
        self._remember(key, Bucket(tokens, capacity, rate, time.time()))
        return allowed

    def test(self, item, *identifiers, cost=1):
        return self.get_window_stats(item, *identifiers).tokens >= cost

    def get_window_stats(self, item, *identifiers):
        key = self._key(item, identifiers)
        seen = self._seen.get()
        if seen is not None and key in seen:
            return seen[key]
        capacity, rate = _shape(item)
        bucket = Bucket(self._ask(self.tokens.peek_tokens, key, capacity, rate),
                        capacity, rate, time.time())
        self._remember(key, bucket)
        return bucket

    def _key(self, item, identifiers):
        """limits' key for the item and identifiers, made once for each caller rather than on
        every hit and read. Keyed by the item's id, with the item kept in the entry: while it
        is there, no other item can take that id, so an entry found is this item's."""
        memo = (id(item), identifiers)
        known = self._keys.get(memo)
        if known is not None:
            return known[1]
        if len(self._keys) >= _KEYS_KEPT:
            self._keys.clear()  # bounded: callers beyond it make their key again
        entry = self._keys[memo] = item, item.key_for(*identifiers)
        return entry[1]

    def forget(self):
        self._seen.set(None)

    @property
    def broken(self):
        """Whether a breaker is open: the store (or a cluster master) failed and has not
        answered since."""
        return bool(self._open)

    def execute(self, *command):
        """A command of another caller of the store (app.tenants.key_cache) on the connection
        the buckets use; Redis only."""
        return self.tokens.execute(*command)

    def trip(self):
        """Open the breaker on behalf of another caller of the store that it failed
        (app.tenants.key_cache, /health), so a worker pays one timeout, not one per caller; on
        a cluster it opens `broken` only (no master is named)."""
        self._break(None)

    def _ask(self, call, key, *args):
        node = self._node_of(key)
        if node in self._open:
            self._break(node)  # a no-op unless this process has no thread asking (a fork)
            raise StoreUnavailable("breaker open")
        try:
            return call(key, *args)
        except self.errors as exc:
            self._break(node)
            raise StoreUnavailable(type(exc).__name__) from exc

    def _break(self, node):
        """Open `node`'s breaker until a thread of this process, asking once a second, finds
        the store answering again."""
        with self._lock:
            asking = self._open.get(node)
            if asking is not None and asking.is_alive():
                return
            asking = self._open[node] = threading.Thread(
                target=_ask_until_answered, args=(weakref.ref(self), node), daemon=True,
                name=f"rate-limit-store-breaker-{node}")
            asking.start()

    def check_store(self):
        """/health's question: whether the store answers now. One that does not (a cluster:
        each master that does not) opens its breaker, as a failed bucket call does, so the
        worker pays the timeout once: a request that then meets that master does not wait
        for it again."""
        if not getattr(self.tokens, "cluster", False):
            if self.storage.check():
                return True
            self.trip()
            return False
        try:
            silent = self.tokens.silent_masters()
        except RedisClusterException:
            self.trip()
            return False
        for name in silent:
            self._break(name)
        return not silent

    def answers(self, node):
        """Whether the store answers now (waiting at most its socket timeout): a cluster master
        by its own PING, any other store by limits' health check (the storage's client and
        pool, raising nothing), so the thread keeps no connection of its own."""
        if getattr(self.tokens, "cluster", False):
            return self.tokens.masters_answer(node)
        return bool(self.storage.check())

    def _close(self, node):
        with self._lock:
            self._open.pop(node, None)

    def _remember(self, key, bucket):
        seen = self._seen.get()
        if seen is None:
            seen = {}
            self._seen.set(seen)
        seen[key] = bucket


def _ask_until_answered(limiter_ref, node):
    """The breaker's thread: once a second, ask the store whether it answers; close the
    breaker when it does. Holds the limiter weakly: a limiter that is gone ends it. It asks
    on whatever a question raises: a thread that ended left its breaker open for good."""
    while True:
        time.sleep(BREAKER_SECONDS)
        limiter = limiter_ref()
        if limiter is None:
            return
        try:
            answered = limiter.answers(node)
        except Exception:  # noqa: BLE001 - logged; the store is taken as not answering
            log.exception("rate-limit store breaker: asking the store failed")
            answered = False
        if answered:
            limiter._close(node)
            return
        del limiter


def _shape(item):
    """(capacity, refill per second) of an item."""
    return item.amount, item.amount / item.get_expiry()


class RateLimitItemPerMicrosecond(RateLimitItem):
    """"N per M microseconds", registered with limits as its own granularities are: a bucket
    whose refill no whole number of seconds spells (capacity 10 refilling 1,000 a minute is 10
    per 0.6 s), which "N per M seconds" would round to another rate."""

    GRANULARITY = Granularity(1e-6, "microsecond")


STRATEGIES["token-bucket"] = TokenBucketRateLimiter
