"""What the CLI groups share: a person at the terminal, one-line errors and JSON output."""
import json
from functools import wraps

import click
from flask.cli import AppGroup, ScriptInfo
from marshmallow import ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError

from app import logs
from app.config import exit_on_config_error
from app.errors import ApiError, _first_message, database_failure


DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


def database_unavailable(exc, config):
    """The one line a command ends with when the database is out of reach: the cause in the
    driver's words, never the password."""
    cause = database_failure(exc, config["SQLALCHEMY_DATABASE_URI"])["cause"]
    return click.ClickException(f"the database is unavailable: {cause}")


class CommandGroup(AppGroup):
    """Our commands: a database out of reach, a key ring that cannot unseal its secrets or an
    argument that is no text end a command with one line, not a traceback."""

    def parse_args(self, ctx, args):
        # Python reads bytes of an argument that are not UTF-8 as lone surrogates
        # (surrogateescape), which no database, log line or JSON output can take.
        for position, arg in enumerate(args, start=1):
            if not arg.isascii():
                try:
                    arg.encode("utf-8")
                except UnicodeEncodeError:
                    raise click.UsageError(f"argument {position} after '{ctx.info_name}' is not "
                                           "valid UTF-8 text", ctx) from None
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        # A key ring that cannot unseal the database's secrets, found at a seal (the start
        # check found the database down): one line and status 3, as at start.
        with exit_on_config_error():
            try:
                return super().invoke(ctx)
            except DATABASE_UNAVAILABLE as exc:
                # The database unreachable, or lost mid-command (each batch of a reseal is its
                # own transaction: run it again).
                app = ctx.ensure_object(ScriptInfo).load_app()
                raise database_unavailable(exc, app.config) from None


class OperatorGroup(CommandGroup):
    """Commands a person runs: routine JSON log lines stay off the terminal (warnings and
    errors still show); under gunicorn the logs are unchanged."""

    def invoke(self, ctx):
        with logs.only_failures():
            return super().invoke(ctx)


def one_line_errors(command):
    """Turn service and validation errors into a single 'Error: ...' line and exit status 1."""

    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ApiError as exc:
            raise click.ClickException(_with_details(exc)) from None
        except ValidationError as exc:
            raise click.ClickException(_first_message(exc.messages)) from None

    return wrapper


def _with_details(exc):
    """The error text, and what its details add to it (the id of a key already registered),
    as the HTTP answer's `details` says it."""
    added = [message for messages in (exc.details or {}).values() for message in messages
             if message != exc.error]
    return exc.error + "".join(f" ({message})" for message in added)


def echo_json(value):
    click.echo(json.dumps(value, indent=2, default=str))
