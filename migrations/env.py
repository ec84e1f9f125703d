import logging
from logging.config import fileConfig

import click
from flask import current_app
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from alembic import context

from app.cli_support import DATABASE_UNAVAILABLE, database_unavailable
from app.config import exit_on_config_error
from app.database import LOCK_TIMEOUT
from app.keyring import checks as key_checks

# this is the Alembic Config object, which provides
# access to the values within the .ini file in use.
config = context.config

# Interpret the config file for Python logging.
# This line sets up loggers basically.
# The app has already set up JSON logging when it runs migrations; only configure logging
# from alembic.ini when it has not.
if not logging.getLogger().handlers:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
logger = logging.getLogger('alembic.env')


def get_engine():
    return current_app.extensions['migrate'].db.engine


def get_engine_url():
    try:
        return get_engine().url.render_as_string(hide_password=False).replace(
            '%', '%%')
    except AttributeError:
        return str(get_engine().url).replace('%', '%%')


# add your model's MetaData object here
# for 'autogenerate' support
# from myapp import mymodel
# target_metadata = mymodel.Base.metadata
config.set_main_option('sqlalchemy.url', get_engine_url())
target_db = current_app.extensions['migrate'].db

# other values from the config, defined by the needs of env.py,
# can be acquired:
# my_important_option = config.get_main_option("my_important_option")
# ... etc.


def get_metadata():
    if hasattr(target_db, 'metadatas'):
        return target_db.metadatas[None]
    return target_db.metadata


def run_migrations_offline():
    """Run migrations in 'offline' mode.

    This configures the context with just a URL
    and not an Engine, though an Engine is acceptable
    here as well.  By skipping the Engine creation
    we don't even need a DBAPI to be available.

    Calls to context.execute() here emit the given string to the
    script output.

    """
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url, target_metadata=get_metadata(), literal_binds=True
    )

    with context.begin_transaction():
        context.run_migrations()


def _bound_lock_waits(connection):
    """Each migration's transaction waits at most LOCK_TIMEOUT for a lock (PostgreSQL): an ALTER
    queued behind a long transaction would hold every query of the table behind it. Set at
    each BEGIN, since each migration is a transaction of its own (below); the statements of an
    autocommit block (an index built concurrently, which blocks no one while it waits) keep
    the session's setting."""
    def bounded(conn):
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            return
        cursor = conn.connection.driver_connection.cursor()
        try:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        finally:
            cursor.close()

    event.listen(connection, "begin", bounded)
    return lambda: event.remove(connection, "begin", bounded)


def _run_migrations():
    try:
        with context.begin_transaction():
            context.run_migrations()
    except OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) != "55P03":  # lock_not_available
            raise
        # One line, as the other commands' failures: the migrations before it are recorded.
        raise click.ClickException(
            f"a migration waited {LOCK_TIMEOUT} for a lock another transaction holds and "
            "stopped, its transaction changing nothing; the migrations before it are done: "
            "run `flask db upgrade` again") from None


def run_migrations_online():
    """Run migrations in 'online' mode.

    In this scenario we need to create an Engine
    and associate a connection with the context.

    """

    # this callback is used to prevent an auto-migration from being generated
    # when there are no changes to the schema
    # reference: http://alembic.zzzcomputing.com/en/latest/cookbook.html
    def process_revision_directives(context, revision, directives):
        if getattr(config.cmd_opts, 'autogenerate', False):
            script = directives[0]
            if script.upgrade_ops.is_empty():
                directives[:] = []
                logger.info('No changes in schema detected.')

    conf_args = current_app.extensions['migrate'].configure_args
    if conf_args.get("process_revision_directives") is None:
        conf_args["process_revision_directives"] = process_revision_directives

    try:
        connection = get_engine().connect()
    except DATABASE_UNAVAILABLE as exc:
        # One line and status 1, as the operator commands answer (not alembic's traceback).
        raise database_unavailable(exc, current_app.config) from None

    with connection:
        # SQLite's batch migrations copy a table and drop the old one: with foreign keys on,
        # that DROP would cascade into every child row (usage, keys). The pragma only takes
        # effect outside a transaction, so it goes to the driver's connection directly.
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        try:
            # Before anything changes: a ring that cannot unseal the stored secrets is refused
            # (one line, exit status 3), whatever revision the database is at.
            with exit_on_config_error():
                key_checks.verify(connection, current_app.config)
            connection.commit()
            # Each migration in a transaction of its own, its version stamp with it: a
            # migration that commits in an autocommit block (an index built concurrently)
            # and is followed by one that fails (a lock not granted) stays recorded as done,
            # where one transaction for the run rolled its stamp back and left its changes,
            # and the next upgrade failed on them for good.
            unbound = (_bound_lock_waits(connection)
                       if connection.dialect.name == "postgresql" else lambda: None)
            context.configure(
                connection=connection,
                target_metadata=get_metadata(),
                transaction_per_migration=True,
                **conf_args
            )
            try:
                _run_migrations()
            finally:
                unbound()  # the key check below waits as the start's does
            # A database that holds secrets but no check values yet gets those of the ring's
            # keys that sealed them (SQLite's DDL is not in a transaction alembic commits).
            with exit_on_config_error():
                key_checks.verify(connection, current_app.config)
            connection.commit()
        finally:
            if sqlite:
                connection.connection.driver_connection.execute("PRAGMA foreign_keys=ON")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
