"""Fixtures: the app on SQLite by default, or on PostgreSQL/Redis when TEST_DATABASE_URL and
TEST_REDIS_URL are set. The schema comes from the Alembic migrations, so they are tested too."""
import json
import os
import subprocess
import sys
import uuid

import pytest
import redis
from cryptography.fernet import Fernet
from flask_migrate import upgrade
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app import create_app
from app.config import normalize_database_url
from app.extensions import db
from app.sql import unit_of_work
from app.tenants import service as tenant_service
from tests.scale_out import Hosts, PgBouncer, RedisClusterProcesses
from tests.servers import ROOT, GunicornServer
from tests.leaks import LeakWatch
from tests.support import Credentials, dump_database

ENCRYPTION_KEY = Fernet.generate_key().decode()
TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL")
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL")
# The scaled-out run of the multi-process tests (.ci/run): the service reaches PostgreSQL
# through PgBouncer, keeps its buckets in a Redis Cluster, and runs as TEST_HOSTS hosts.
TEST_PGBOUNCER = os.environ.get("TEST_PGBOUNCER") == "1"
TEST_REDIS_CLUSTER = os.environ.get("TEST_REDIS_CLUSTER") == "1"
TEST_HOSTS = int(os.environ.get("TEST_HOSTS", "1"))


@pytest.fixture(scope="session")
def database_url(tmp_path_factory):
    if TEST_DATABASE_URL:
        engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
        with engine.begin() as connection:
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
        engine.dispose()
        return TEST_DATABASE_URL
    return "sqlite:///" + str(tmp_path_factory.mktemp("db") / "test.db")


@pytest.fixture(scope="session")
def base_settings(database_url, tmp_path_factory):
    return {
        "TESTING": True,
        "SQLALCHEMY_DATABASE_URI": database_url,
        "REDIS_URL": TEST_REDIS_URL,
        "SECRET_ENCRYPTION_KEY": ENCRYPTION_KEY,
        "CONTEXT_STORE_URL": None,
        "CORS_ORIGINS": [],
        "MULTI_TENANCY": True,
        "SMTP_HOST": None,
    }


@pytest.fixture(scope="session")
def migrated(base_settings):
    app = create_app(dict(base_settings))
    with app.app_context():
        upgrade()
    return True


@pytest.fixture
def empty_database_url(tmp_path):
    """A database of its own (the suite's shared one is already at the newest revision)."""
    if not TEST_DATABASE_URL:
        yield "sqlite:///" + str(tmp_path / "migration.db")
        return
    name = f"migration_{uuid.uuid4().hex[:12]}"
    admin = create_engine(normalize_database_url(TEST_DATABASE_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(TEST_DATABASE_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def settings(base_settings):
    """Per-test overrides: a test edits this dict before asking for `app`."""
    return dict(base_settings)


@pytest.fixture
def leak_watch():
    return LeakWatch()


@pytest.fixture
def app(settings, migrated, leak_watch):
    """The app, with no context pushed: each request gets its own, as in production. Setup
    and checks that read the database push one for themselves (`with app.app_context()`)."""
    app = create_app(settings)
    leak_watch.watch(app)
    yield app
    with app.app_context():
        leaked = leak_watch.leaks_in(dump_database()), leak_watch.leaks_in(
            leak_watch.buffer.getvalue())
        _clean_database()
    leak_watch.close()
    assert leaked == ([], []), f"secrets found in (database, logs): {leaked}"
    assert leak_watch.response_leaks == [], "private key material in a response"
    if TEST_REDIS_URL:
        client = redis.Redis.from_url(TEST_REDIS_URL)
        for pattern in ("intentgate:*", "LIMITS:*"):
            for key in client.scan_iter(pattern):
                client.delete(key)


def _clean_database():
    """Every table emptied, dependants first, and ids starting at 1 again. DELETE, not
    TRUNCATE: on these few rows it takes a millisecond where TRUNCATE's new files took 40 to
    180 ms, after every test of a suite of a thousand."""
    for table in reversed(db.metadata.sorted_tables):
        db.session.execute(text(f"DELETE FROM {table.name}"))
    if db.engine.dialect.name == "postgresql":
        db.session.execute(text(
            "SELECT setval(oid::regclass, 1, false) FROM pg_class "
            "WHERE relkind = 'S' AND relnamespace = 'public'::regnamespace"))
    db.session.commit()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


def _provision(plan="free", email=None):
    email = email or f"tenant{os.urandom(4).hex()}@example.com"
    with unit_of_work():
        provisioned = tenant_service.create_tenant(email, plan)
    return Credentials(provisioned.tenant.id, email, provisioned.api_key, provisioned.signing_secret)


@pytest.fixture
def make_tenant(app, leak_watch):
    def make(plan="free", email=None):
        with app.app_context():
            credentials = _provision(plan, email)
        leak_watch.add(credentials.api_key, credentials.signing_secret)
        return credentials

    return make


@pytest.fixture
def tenant(make_tenant):
    return make_tenant("starter")


@pytest.fixture
def admin_headers(runner, leak_watch):
    """An admin key named "ops" (audit entries say `admin:ops`), watched for leaks."""
    admin = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "ops",
                                           "--json"]).stdout)
    leak_watch.add(admin["api_key"], admin["signing_secret"])
    return {"X-Service-Key": admin["api_key"]}


@pytest.fixture(scope="session")
def pgbouncer():
    """PgBouncer (transaction pooling) in front of the test database, for the whole run."""
    bouncer = PgBouncer(TEST_DATABASE_URL).start()
    yield bouncer
    bouncer.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A local three-master Redis Cluster, for the whole run."""
    cluster = RedisClusterProcesses(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def gunicorn(request, tmp_path, base_settings, migrated, leak_watch):
    """Start gunicorn on the test database (PostgreSQL): gunicorn(workers=4, **environment).
    Migrations ran directly against PostgreSQL (`migrated`); the service itself goes through
    PgBouncer when TEST_PGBOUNCER=1, and runs as TEST_HOSTS instances answering in turn."""
    if not TEST_DATABASE_URL:
        pytest.skip("multi-process tests need PostgreSQL: set TEST_DATABASE_URL "
                    "(SQLite is the single-host embedded default)")
    service = {"DATABASE_URL": TEST_DATABASE_URL, "SECRET_ENCRYPTION_KEY": ENCRYPTION_KEY}
    if TEST_PGBOUNCER:
        service["DATABASE_URL"] = request.getfixturevalue("pgbouncer").url
    if TEST_REDIS_CLUSTER:
        cluster = request.getfixturevalue("redis_cluster")
        cluster.flush()  # the failed-authentication buckets of earlier tests
        service["REDIS_URL"] = cluster.url
    elif TEST_REDIS_URL:
        service["REDIS_URL"] = TEST_REDIS_URL
    servers = []

    def start(workers=4, threads=1, **environment):
        env = {**service, **{key: str(value) for key, value in environment.items()}}
        hosts = []
        for _ in range(TEST_HOSTS):
            server = GunicornServer(tmp_path / f"gunicorn-{len(servers)}.log", env, workers,
                                    threads)
            servers.append(server)
            hosts.append(server.start())
        return hosts[0] if TEST_HOSTS == 1 else Hosts(hosts)

    yield start
    _stop_and_check(servers, leak_watch)


def _stop_and_check(servers, leak_watch):
    for server in servers:
        server.stop()
    for server in servers:
        leaked = leak_watch.leaks_in(server.log_path.read_text(errors="replace"))
        assert leaked == [], f"secrets found in the server log: {leaked}"


@pytest.fixture
def embedded_gunicorn(tmp_path, leak_watch):
    """gunicorn on the embedded defaults: its own SQLite file, no Redis. Yields (server, cli)
    where cli(*args) runs a flask command against the same database."""
    if TEST_DATABASE_URL:
        # The same processes on the same SQLite file whatever the suite's backend: on
        # PostgreSQL these tests would repeat the SQLite suite's run to the byte, four minutes
        # of CI's longer line (as tests/test_first_run.py).
        pytest.skip("the embedded defaults whatever the backend: run by the SQLite suite")
    database_url = "sqlite:///" + str(tmp_path / "embedded.db")
    env = {"DATABASE_URL": database_url, "SECRET_ENCRYPTION_KEY": ENCRYPTION_KEY,
           "REDIS_URL": "", "FLASK_APP": "wsgi"}

    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "flask", *args], cwd=ROOT,
                                env={**os.environ, **env}, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    cli("db", "upgrade")
    servers = []

    def start(workers=2, threads=4, ca_file=None, **environment):
        server = GunicornServer(tmp_path / f"embedded-{len(servers)}.log",
                                {**env, **{k: str(v) for k, v in environment.items()}},
                                workers, threads, ca_file=ca_file)
        servers.append(server)
        return server.start()

    yield start, cli
    _stop_and_check(servers, leak_watch)


def pytest_report_header(config):
    database = "PostgreSQL (TEST_DATABASE_URL)" if TEST_DATABASE_URL else (
        "SQLite; PostgreSQL and multi-process tests skip (set TEST_DATABASE_URL)")
    store = "Redis (TEST_REDIS_URL)" if TEST_REDIS_URL else (
        "database token bucket; Redis tests skip (set TEST_REDIS_URL)")
    scaled = [name for name, on in (("through PgBouncer", TEST_PGBOUNCER),
                                    ("on a Redis Cluster", TEST_REDIS_CLUSTER),
                                    (f"as {TEST_HOSTS} hosts", TEST_HOSTS > 1)) if on]
    lines = [f"database: {database}", f"rate-limit store: {store}"]
    if scaled:
        lines.append("gunicorn fixture: " + ", ".join(scaled))
    return lines
