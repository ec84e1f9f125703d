"""The request path's PL/pgSQL functions are the Core statements the code builds, no other."""
import importlib.util
from pathlib import Path

import pytest
from sqlalchemy.dialects.postgresql import psycopg2

from app import create_app
from app.intents.gate import VERIFY_FUNCTION
from app.intents.service import ISSUE_FUNCTION
from app.tenants.keys import KEY_LOOKUP_FUNCTION

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations" / "versions"


def _newest_definitions():
    """Each function's definition in the newest migration that creates it."""
    modules = {}
    for path in MIGRATIONS.glob("*.py"):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[module.revision] = module
    (head,) = set(modules) - {module.down_revision for module in modules.values()}
    found, revision = {}, head
    while revision is not None:  # from the newest migration back to the first
        module = modules[revision]
        for name in ("KEY_LOOKUP_FUNCTION", "VERIFY_FUNCTION", "ISSUE_FUNCTION"):
            found.setdefault(name, (revision, getattr(module, name, None)))
            if found[name][1] is None:
                del found[name]
        revision = module.down_revision
    return found


@pytest.mark.parametrize("name, function", [("KEY_LOOKUP_FUNCTION", KEY_LOOKUP_FUNCTION),
                                            ("VERIFY_FUNCTION", VERIFY_FUNCTION),
                                            ("ISSUE_FUNCTION", ISSUE_FUNCTION)])
def test_the_migration_creates_what_the_code_builds(settings, name, function):
    """Changed the gate, the key lookup or the issuing of intents? Write a migration that
    creates the new definition (function.definition(psycopg2.dialect())); PostgreSQL would
    otherwise run the old one."""
    # An app for PostgreSQL (it never connects here): the statements are built for its dialect.
    settings["SQLALCHEMY_DATABASE_URI"] = "postgresql://nobody@127.0.0.1:1/none"
    with create_app(settings).app_context():
        expected = function.definition(psycopg2.dialect())
    revision, definition = _newest_definitions()[name]
    assert definition == expected, f"{name} differs from migration {revision}"
