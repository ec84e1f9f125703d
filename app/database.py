"""The request path's database access: Core statements compiled once, run on DBAPI connections.

Measured on this stack, SQLAlchemy's Connection and Result machinery costs about 150 us of Python
per statement and a session checkout with autocommit switching twice that, where a pooled DBAPI
cursor costs about 25 us. The few statements on the request path (authentication, the gate,
issuing an intent, health) are therefore built with SQLAlchemy Core, compiled once for the
dialect chosen at start-up, and executed on a DBAPI connection from the same engine's pool.
Everything else (admin, CLI, tenants) keeps the ORM session.

Connections of the request path are in autocommit mode: a single statement is its own
transaction (one round trip, no BEGIN/COMMIT), and `transaction()` opens an explicit one where a
unit of work has several statements. Nothing stays in a database session between transactions
(no prepared statements, no SET), so PgBouncer in transaction mode is fine.

Each thread keeps the connection it took from the pool from one request to the next (a sync
worker serves one request at a time, a gthread worker one a thread), at most the pool's size
of them: the pool's checkout and return cost a verify 94 K instructions of 2.2 M, a generate
99 K of 2.0 M (bench/instructions.py, before and after). What the pool did at each checkout is
done here: a connection is handed back to the pool, and taken again, once it has been kept for
`pool_recycle` (the pool recycles it then: it is at least that old); one that was cut, found
dead or left in a transaction is dropped, and so are the others' kept connections once a dead
one has emptied the pool (or the engine was disposed), so that each thread reconnects at once.
"""
import logging
import os
import re
import threading
import time
from collections import namedtuple
from contextlib import contextmanager

from flask import current_app, g, has_request_context
from sqlalchemy import create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.dialects import postgresql, sqlite

from app import statement_deadline
from app.config import REQUEST_SECONDS
from app.errors import Unavailable, database_failure

log = logging.getLogger(__name__)

# This process's id, kept current across forks (a gunicorn worker) without a system call on
# every request: a connection kept in another process is that process's socket.
_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_inherited = []  # connections a parent process kept: see Database.connection

UNAVAILABLE_TEXT = "service temporarily unavailable"
# How long a request-path statement waits for a lock before it gives up (a 503 that leaves
# nothing written): well inside SPEC.md's 30 s request budget.
LOCK_SECONDS = 5
LOCK_TIMEOUT = f"{LOCK_SECONDS}s"
CUT_TEXT = "statement cut at its deadline"


class Statement:
    """A Core statement compiled for one dialect; rows come back as named tuples."""

    def __init__(self, statement, dialect):
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        # Values the statement carries itself (literals, `values(x=None)`); the rest are given
        # at each execution.
        self.defaults = {name: bind.effective_value for name, bind in compiled.binds.items()
                         if not bind.required}
        self._row = None

    def row_type(self, description):
        names = tuple(column[0] for column in description)
        if self._row is None or self._row._fields != names:
            # Made again when the columns change (a function a migration replaced under a
            # running worker) rather than fitting new columns into the old names.
            self._row = namedtuple("Row", names)
        return self._row


class Database:
    """The request path's engine (autocommit) and its statements, decided once per app."""

    def __init__(self, url, engine_options, statement_seconds=None):
        options = dict(engine_options)
        self.dialect_name = url.split(":", 1)[0].split("+", 1)[0]
        if self.dialect_name == "sqlite":
            # pysqlite in autocommit (isolation_level None); BEGIN IMMEDIATE is explicit below.
            self.engine = create_engine(url, **options)
            event.listen(self.engine, "connect", _sqlite_connect)
            self.begin_sql = "BEGIN IMMEDIATE"
            self.compile_dialect = sqlite.dialect(paramstyle="named")
        else:
            self.engine = create_engine(url, isolation_level="AUTOCOMMIT",
                                        pool_reset_on_return=None, **options)
            self.begin_sql = "BEGIN"
            self.compile_dialect = self.engine.dialect
        self.dbapi = self.engine.dialect.loaded_dbapi
        # PostgreSQL runs a unit of several writes (the gate) as one function call, its own
        # transaction; SQLite runs its statements inside BEGIN IMMEDIATE.
        self.composes_writes = self.dialect_name == "postgresql"
        # PostgreSQL's answers come over a socket that may stop answering; SQLite's do not.
        self.statement_seconds = statement_seconds if self.dialect_name == "postgresql" else None
        self._statements = {}
        # Each thread's kept connection (see the module's docstring); `generation` counts the
        # times a dead connection emptied the pool, which drops every thread's.
        self._kept = threading.local()
        self.generation = 0
        self.recycle_seconds = options.get("pool_recycle", -1)
        # At most the pool's size is kept, so that a gthread worker of more threads than that
        # still has connections to check out and return (its other threads do so each request).
        self._keeping, self._keep_at_most = 0, options.get("pool_size", 5)
        self._lock = threading.Lock()

    def insert(self, table):
        """An INSERT of this dialect, with on_conflict_do_nothing() / on_conflict_do_update()."""
        return (postgresql.insert if self.dialect_name == "postgresql" else sqlite.insert)(table)

    def statement(self, key, build):
        """The compiled form of the statement `build()` makes, built once per app."""
        compiled = self._statements.get(key)
        if compiled is None:
            compiled = self._statements[key] = Statement(build(), self.compile_dialect)
        return compiled

    def connection(self):
        """The connection of this thread's request: the one the thread kept, while it may still
        be used, or a fresh one from the pool (kept if there is room, else borrowed until the
        request ends). Raises what the pool raises when it cannot connect."""
        kept = self._kept
        connection = getattr(kept, "connection", None)
        if connection is not None:
            if kept.in_request:
                return connection  # judged at the request's first statement, not within it
            if (kept.pid == _pid[0] and self._pool_current(kept) and connection.is_valid
                    and time.monotonic() < kept.until):
                kept.in_request = True
                return connection
            if kept.pid != _pid[0]:
                # Inherited across a fork: the parent's session. Neither closed (that would end
                # it) nor let go to the garbage collector, which would hand it to this
                # process's pool: kept out of the pool, for good.
                connection.detach()
                _inherited.append(connection)
            elif self._pool_current(kept):
                connection.close()  # back to the pool, which recycles it if it is that old
            else:
                connection.invalidate()  # its pool was emptied or disposed: closed, not pooled
            self._let_go()
        # The generation before the checkout: a connection that died before a later bump must
        # not pass for one taken after it.
        generation = self.generation
        connection = self.engine.raw_connection()
        with self._lock:
            keeping = self._keeping < self._keep_at_most
            self._keeping += keeping
        kept.connection, kept.borrowed, kept.in_request = connection, not keeping, True
        kept.pid, kept.pool, kept.generation = _pid[0], self.engine.pool, generation
        kept.until = time.monotonic() + (
            self.recycle_seconds if self.recycle_seconds >= 0 else float("inf"))
        return connection

    def holds(self, connection):
        """Whether `connection` is still this thread's (not dropped as dead meanwhile)."""
        return getattr(self._kept, "connection", None) is connection

    def end_request(self, _exc=None):
        """The request's end: its connection stays this thread's for the next request, or goes
        back to the pool if borrowed; closed for good if it was cut at its deadline (dead) or
        left in a transaction."""
        kept = self._kept
        connection = getattr(kept, "connection", None)
        if connection is None:
            return
        kept.in_request = False
        if connection.info.pop("cut", False) or _left_in_transaction(connection):
            self.drop(connection)
        elif kept.borrowed:
            kept.connection = None
            if self._pool_current(kept):
                connection.close()
            else:
                connection.invalidate()  # as dead as the one that emptied the pool

    def drop(self, connection):
        """Close `connection` for good (cut at its deadline, dead, or left in a transaction):
        not kept, not pooled."""
        connection.invalidate()
        if self.holds(connection):
            self._let_go()

    def _pool_current(self, kept):
        """Whether the pool `kept`'s connection came from still stands: no dead connection has
        emptied it since, and the engine was not disposed."""
        return kept.pool is self.engine.pool and kept.generation == self.generation

    def _let_go(self):
        kept = self._kept
        if not kept.borrowed:
            with self._lock:
                self._keeping -= 1
        kept.connection = None


def _left_in_transaction(connection):
    """Whether a transaction is still open on `connection` at the request's end (a failure
    between BEGIN and its COMMIT or ROLLBACK, say a COMMIT that SQLite refused): the pool's
    reset would have ended it, and a kept connection must not carry it, or its locks, into the
    next request. psycopg2 asks libpq (no round trip); sqlite3 knows it."""
    dbapi_connection = connection.dbapi_connection
    status = getattr(dbapi_connection, "get_transaction_status", None)
    if status is not None:
        return status() != 0  # psycopg2.extensions.TRANSACTION_STATUS_IDLE
    return dbapi_connection.in_transaction


class Function:
    """A request-path statement that PostgreSQL keeps as a PL/pgSQL function, so its plan is
    parsed and planned once per server connection instead of on every call (measured: the
    gate's statement costs 0.7 ms of PostgreSQL CPU each time it is planned, 0.38 ms as a
    function). The body is the same Core statement compiled for PostgreSQL: `definition()` is
    what a migration creates, and a test holds the migration to it. Nothing lives in the
    database session, so PgBouncer in transaction mode is fine.

    `arguments` and `returns` are (name, PostgreSQL type) pairs, in order.

    Each function waits at most LOCK_TIMEOUT for a lock (a row another transaction holds, a
    table a migration has locked): then PostgreSQL aborts the statement, nothing of it is
    written, and the request gets a 503 within its budget, not a reset from gunicorn's timeout
    while the statement may still commit. A function's own SET works through PgBouncer: it
    lasts for the call only, nothing is left in the session."""

    def __init__(self, name, build, arguments, returns):
        self.name, self.build = name, build
        self.arguments, self.returns = tuple(arguments), tuple(returns)
        self.variables = ()  # a Procedure's own

    def definition(self, dialect):
        arguments = ", ".join(f"p_{name} {kind}" for name, kind in self.arguments)
        declare = ("DECLARE\n" + "".join(f"p_{name} {kind};\n" for name, kind in self.variables)
                   if self.variables else "")
        return (f"CREATE OR REPLACE FUNCTION {self.name}({arguments})\n"
                f"RETURNS {self._result_type()} LANGUAGE plpgsql\n"
                f"SET lock_timeout = '{LOCK_TIMEOUT}' AS $function$\n"
                f"#variable_conflict use_column\n{declare}BEGIN\n{self._body(dialect)}\n"
                f"END\n$function$")

    def _result_type(self):
        return "TABLE(" + ", ".join(f"{name} {kind}" for name, kind in self.returns) + ")"

    def _body(self, dialect):
        return f"RETURN QUERY {plpgsql(self.build(), dialect)};"

    def call(self):
        """The statement that calls the function with the same named parameters."""
        return f"SELECT * FROM {self.name}({self._placeholders()})"

    def _placeholders(self):
        return ", ".join(f"%({name})s" for name, _ in self.arguments)


class Procedure(Function):
    """A request-path function of several statements, with PL/pgSQL deciding between them.

    Measured (pgbench, one client, PostgreSQL CPU per call): a statement of data-modifying CTEs
    pays at every call for setting up all its plan nodes and subplans, those of the branches it
    will not take included; a few plain statements, each run only when the steps before call
    for it, cost the gate 6-12 % less (0.30 ms -> 0.28 for a limited plan, 0.265 for an
    unlimited one). `steps(sql)` writes the body: `sql(statement)` is a Core statement compiled
    for PostgreSQL, its parameters the function's arguments and `variables` (both p_<name>), to
    be completed with `INTO p_<name>, ...` where it returns rows. The body assigns the result
    columns and ends with RETURN NEXT; a plain RETURN before it answers no row. PostgreSQL's
    only: on SQLite the caller runs the same statements itself."""

    def __init__(self, name, steps, arguments, variables, returns):
        super().__init__(name, None, arguments, returns)
        self.steps, self.variables = steps, tuple(variables)

    def _body(self, dialect):
        return self.steps(lambda statement: plpgsql(statement, dialect))


class ScalarProcedure(Procedure):
    """A Procedure answering one value (`returns`: one (name, type) pair): the body ends with
    RETURN <value>, and the call answers one row holding it under that name.

    Measured (callgrind, the gate on PostgreSQL 15, instructions per call): a set-returning
    function called in FROM (`SELECT * FROM f(...)`) has PostgreSQL build its result's row
    type from the function's declared columns and plan a function scan at every call, and
    RETURN NEXT fills a tuplestore; `SELECT f(...)` of one value does neither: 61,100 fewer
    instructions per cleared verify (605,000 -> 543,900; bench/pg_instructions.py)."""

    def _result_type(self):
        ((_, kind),) = self.returns
        return kind

    def call(self):
        ((name, _),) = self.returns
        return f"SELECT {self.name}({self._placeholders()}) AS {name}"


def plpgsql(clause, dialect):
    """`clause` (a Core statement or expression) compiled for PL/pgSQL: each bound parameter is
    the variable p_<name>, or the literal value the clause carries itself."""
    compiled = Statement(clause, dialect)

    def placeholder(match):
        name = match.group(1)
        if name in compiled.defaults:
            return _sql_literal(compiled.defaults[name])
        return "p_" + name

    return re.sub(r"%\((\w+)\)s", placeholder, compiled.sql)


def _sql_literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _sqlite_connect(dbapi_connection, _record):
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA journal_mode=WAL")
    dbapi_connection.execute("PRAGMA foreign_keys=ON")


def init_app(app, engine_options):
    app.extensions["database"] = Database(app.config["SQLALCHEMY_DATABASE_URI"], engine_options,
                                          app.config["DATABASE_STATEMENT_SECONDS"])
    app.teardown_request(app.extensions["database"].end_request)


def current():
    return current_app.extensions["database"]


def _connection(database):
    try:
        return database.connection()
    except Exception as exc:  # noqa: BLE001 - _unavailable re-raises what is not the database's
        _unavailable(exc, None)


def _function_missing(exc):
    """PostgreSQL lacks one of this release's request-path functions (undefined_function, of
    ours by name): a `flask db downgrade` run before the previous release was back, or a
    release started before its `flask db upgrade`. Any other undefined thing is a bug: 500."""
    return getattr(exc, "pgcode", None) == "42883" and "intentgate_" in str(exc).split("\n")[0]


def _unavailable(exc, connection):
    """Turn the database's own failure into the contract's 503; anything else is re-raised."""
    database = current()
    if _function_missing(exc):
        # The operator's to fix (upgrade, or put the previous release back), so no Retry-After;
        # a 500 would say the request was at fault.
        log.error("the database lacks a function this release calls: its schema is older than "
                  "the release (run `flask db upgrade`, or roll the release back)",
                  extra=database_failure(exc))
        raise Unavailable(UNAVAILABLE_TEXT) from None
    if not isinstance(exc, (database.dbapi.OperationalError, database.dbapi.InterfaceError)):
        raise exc
    if connection is not None and database.engine.dialect.is_disconnect(exc, connection, None):
        # A dead connection (database restarted): drop it and its pooled siblings, as
        # SQLAlchemy does on a disconnect, so the next request reconnects.
        database.drop(connection)
        database.engine.pool.dispose()
        database.generation += 1  # the other threads' kept connections are as dead
    log.error("database unavailable", extra=database_failure(exc))
    raise Unavailable(UNAVAILABLE_TEXT, headers={"Retry-After": "1"}) from None


def execute(key, build, params):
    """Run a statement of the request path; return its rows as named tuples."""
    database = current()
    return _rows(database, database.statement(key, build), params)


def call(function, params):
    """Run `function` where PostgreSQL holds it, else its statement; return the first row."""
    database = current()
    if database.dialect_name != "postgresql":
        return first(function.name, function.build, params)
    statement = database._statements.get(function.name)
    if statement is None:
        statement = database._statements[function.name] = _CallStatement(function.call())
    rows = _rows(database, statement, params)
    return rows[0] if rows else None


class _CallStatement(Statement):
    """The call of a Function: plain SQL, nothing to compile."""

    def __init__(self, sql):  # pylint: disable=super-init-not-called
        self.sql, self.defaults, self._row = sql, {}, None


def _rows(database, statement, params):
    connection = _connection(database)
    values = {**statement.defaults, **params} if statement.defaults else params
    cursor = connection.cursor()
    try:
        _execute(database, connection, cursor, statement.sql, values)
        description = cursor.description
        rows = cursor.fetchall() if description is not None else None
    except Exception as exc:  # noqa: BLE001 - _unavailable re-raises what is not the database's
        cursor.close()
        _unavailable(exc, connection)
    cursor.close()
    if rows is None:
        return []
    row_type = statement.row_type(description)
    return [row_type(*row) for row in rows]


def first(key, build, params):
    rows = execute(key, build, params)
    return rows[0] if rows else None


@contextmanager
def transaction(single_statement=False):
    """Several statements of the request path as one transaction (BEGIN IMMEDIATE on SQLite,
    so concurrent writers queue instead of failing); rolled back on any error.

    `single_statement`: the caller's work is one statement where the dialect composes writes
    (PostgreSQL); that statement is then its own transaction, saving two round trips."""
    database = current()
    if single_statement and database.composes_writes:
        yield
        return
    connection = _connection(database)
    _run(database, connection, database.begin_sql)
    try:
        yield
    except BaseException:
        if database.holds(connection):  # not dropped as dead meanwhile
            _run(database, connection, "ROLLBACK")
        raise
    _run(database, connection, "COMMIT")


def _run(database, connection, sql):
    cursor = connection.cursor()
    try:
        _execute(database, connection, cursor, sql)
    except Exception as exc:  # noqa: BLE001 - _unavailable re-raises what is not the database's
        cursor.close()
        _unavailable(exc, connection)
    cursor.close()


def _execute(database, connection, cursor, *statement):
    """cursor.execute(*statement), cut (a disconnect: the 503) when PostgreSQL has not answered
    within the statement's deadline."""
    seconds = _statement_seconds(database)
    if seconds is None:
        return cursor.execute(*statement)
    statement_deadline.start(connection, seconds)
    try:
        return cursor.execute(*statement)
    finally:
        if statement_deadline.stop():
            # Cut as its answer came: the connection is dead; end_request drops it, so that
            # no later request uses it (this engine resets nothing on return).
            connection.info["cut"] = True


def _statement_seconds(database):
    """How long a statement of this request may wait for PostgreSQL's answer:
    DATABASE_STATEMENT_SECONDS, or what is left of the request's budget if that is sooner.
    None where nothing is watched (SQLite answers from a file, not a socket)."""
    seconds = database.statement_seconds
    started = g.get("request_started")  # app.http, on time.perf_counter's clock
    if seconds is not None and started is not None:
        seconds = min(seconds, max(started + REQUEST_SECONDS - time.perf_counter(), 0.0))
    return seconds


def watch_session_statements(engine):
    """The request path's bounds for the ORM session's statements in a request (the tenant,
    admin and webhook endpoints), which would otherwise wait on a frozen database, or on a row
    lock a stuck transaction holds, until gunicorn killed the worker: LOCK_TIMEOUT for a lock
    (then PostgreSQL aborts the statement, a 503 that leaves nothing written), and the
    statement deadline. Statements outside a request (the CLI, migrations, the webhook worker)
    are not bounded: a migration may rightly run for minutes."""
    if current().statement_seconds is None:
        return

    @event.listens_for(engine, "begin")
    def _bound_lock_waits(connection):
        if has_request_context():  # SET LOCAL: this transaction only (PgBouncer keeps nothing)
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")

    @event.listens_for(engine, "before_cursor_execute")
    def _watch(_connection, cursor, _statement, _parameters, _context, _executemany):
        if has_request_context():
            statement_deadline.start(cursor.connection, _statement_seconds(current()))

    @event.listens_for(engine, "after_cursor_execute")
    def _answered(connection, _cursor, statement, parameters, _context, _executemany):
        if statement_deadline.stop():
            # Cut as its answer came: the connection is dead and its transaction lost. Dropped
            # now (its rollback at the request's end would fail on it), and the request is
            # the 503 of any statement cut at its deadline.
            connection.invalidate()
            raise OperationalError(statement, parameters,
                                   current().dbapi.OperationalError(CUT_TEXT),
                                   connection_invalidated=True)

    @event.listens_for(engine, "handle_error")
    def _failed(_context):
        statement_deadline.stop()
