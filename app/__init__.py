"""Application factory: reads as a table of contents of the service."""
import json
import os

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from sqlalchemy import event
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.routing import IntegerConverter, UnicodeConverter

from app import config as settings
from app import crypto, database, errors, http, https_only, logs, metrics
from app.context_store import taxonomy
from app.extensions import context_store, cors, db, migrate
from app.keyring import checks as key_checks
from app.tenants import key_cache
from app.traffic import limits


class PathSegment(UnicodeConverter):
    """A string path parameter (a key id): one segment without control characters. A NUL would
    otherwise reach the database, which refuses it with an error of its own (a 500)."""

    def __init__(self, url_map, *args, **kwargs):
        super().__init__(url_map, *args, **kwargs)
        self.regex = self.regex.replace("[^/]", "[^/\\x00-\\x1f\\x7f]")


class AsciiInteger(IntegerConverter):
    """An id in the path (a tenant's): ASCII digits only. werkzeug's pattern also takes other
    scripts' digits, so /v1/admin/tenants/ followed by U+0661 (ARABIC-INDIC DIGIT ONE) reached
    tenant 1 under a second name, where every other id the service reads (query strings, the
    CLI) is ASCII digits alone."""

    regex = "[0-9]+"


class JsonProvider(DefaultJSONProvider):
    """Flask's JSON, with one encoder kept for each set of options: json.dumps builds a new
    encoder on every call given any option, and every response passes some (Flask's
    separators, sort_keys and default)."""

    _OPTIONS = frozenset(("skipkeys", "ensure_ascii", "check_circular", "allow_nan",
                          "sort_keys", "indent", "separators", "default"))

    def __init__(self, app):
        super().__init__(app)
        self._encoders = {}

    def dumps(self, obj, **kwargs):
        kwargs.setdefault("default", self.default)
        kwargs.setdefault("ensure_ascii", self.ensure_ascii)
        kwargs.setdefault("sort_keys", self.sort_keys)
        try:
            options = frozenset(kwargs.items())
        except TypeError:  # an option that cannot be a key (separators as a list)
            options = None
        if options is None or not self._OPTIONS.issuperset(kwargs):  # cls=, say: as Flask does
            return super().dumps(obj, **kwargs)
        encoder = self._encoders.get(options)
        if encoder is None:
            encoder = self._encoders[options] = json.JSONEncoder(**kwargs)
        return encoder.encode(obj)


class IntentGate(Flask):
    """Flask, with the coroutine test of each view and hook made once per function instead of
    on every call (a dozen inspect calls per request, and none of our functions is async), and
    routing that answers in the contract's JSON: no redirects, automatic OPTIONS in JSON."""

    json_provider_class = JsonProvider

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._callables = {}
        self.url_map.converters["default"] = self.url_map.converters["string"] = PathSegment
        self.url_map.converters["int"] = AsciiInteger
        # werkzeug would redirect "/v1//x" to "/v1/x" with an HTML page and a Location made
        # from the client's Host header; such a path is simply not found.
        self.url_map.merge_slashes = False

    def make_default_options_response(self):
        """The automatic OPTIONS answer (CORS preflights too), in JSON like every response."""
        allowed = super().make_default_options_response().allow
        response = self.json.response({"allow": sorted(allowed)})
        response.allow.update(allowed)
        return response

    def ensure_sync(self, func):
        ready = self._callables.get(func)
        if ready is None:
            ready = self._callables[func] = super().ensure_sync(func)
        return ready


def create_app(overrides=None):
    # No static folder: an API serves no files, and Flask's /static/<path> route would answer
    # OPTIONS with GET allowed on paths whose GET is a 404.
    app = IntentGate(__name__, instance_relative_config=True, static_folder=None)
    configure(app, overrides)
    logs.init_app(app)
    register_extensions(app)
    app.extensions["secret_keys"] = key_checks.check_at_start(app.config)
    register_request_hooks(app)
    register_blueprints(app)
    errors.init_app(app)
    register_commands(app)
    return app


def configure(app, overrides):
    app.config.update(settings.from_environment(app.instance_path))
    app.config.update(overrides or {})
    settings.validate(app.config)
    crypto.use_local_key_if_unset(app.config, app.instance_path)
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = _engine_options(app.config)
    if app.config["TRUSTED_PROXY_HOPS"]:
        hops = app.config["TRUSTED_PROXY_HOPS"]
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)


def _engine_options(config):
    if config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        os.makedirs(os.path.dirname(config["SQLALCHEMY_DATABASE_URI"][len("sqlite:///"):]) or ".",
                    exist_ok=True)
        # How long a statement waits for another connection's write lock before it fails (a
        # 503): as long as PostgreSQL's statements wait for a lock (LOCK_TIMEOUT), well inside
        # the request's budget. 30 s held a request (and its thread) past the budget.
        return {"connect_args": {"timeout": database.LOCK_SECONDS}}
    # No pool_pre_ping: it costs a round trip on every request. After a database restart the
    # first use of a dead connection fails (503), SQLAlchemy then invalidates the whole pool,
    # and the next request reconnects.
    return {"pool_size": 5, "max_overflow": 5, "pool_recycle": 3600,
            "connect_args": {"connect_timeout": 5}}


def register_extensions(app):
    db.init_app(app)
    with app.app_context():
        _tune_sqlite(db.engine)
    migrate.init_app(app, db, directory=os.path.join(os.path.dirname(app.root_path), "migrations"))
    database.init_app(app, app.config["SQLALCHEMY_ENGINE_OPTIONS"])
    with app.app_context():
        database.watch_session_statements(db.engine)
    limits.init_app(app)
    key_cache.init_app(app)
    if app.config["CORS_ORIGINS"]:  # no browser origin allowed: no CORS work per request
        cors.init_app(
            app,
            resources={r"/v1/*": {"origins": app.config["CORS_ORIGINS"]}},
            allow_headers=["X-Service-Key", "Content-Type", "Idempotency-Key", "X-Request-Id"],
            expose_headers=["X-Request-Id", "X-RateLimit-Limit", "X-RateLimit-Remaining",
                            "X-RateLimit-Reset", "Retry-After", "Idempotent-Replayed"],
            methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
            max_age=600,
        )
    context_store.init_app(app)
    taxonomy.init_app(app)


def _tune_sqlite(engine):
    """Embedded SQLite: WAL, and BEGIN IMMEDIATE so concurrent writers queue instead of failing."""
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def register_request_hooks(app):
    """Every request passes these, in this order (Flask runs after_request hooks last first)."""
    app.before_request(http.assign_request_id)
    app.before_request(https_only.refuse_plain_http)
    app.before_request(http.refuse_leading_slashes)
    after = [https_only.strict_transport, http.protective_headers]
    if app.config["METRICS_ENABLED"]:
        after.append(metrics.observe)
    after.append(logs.log_request)
    for hook in reversed(after):
        app.after_request(hook)


def register_blueprints(app):
    from app import health, openapi
    from app.admin.routes import bp as admin_bp
    from app.intents.routes import bp as intent_bp
    from app.tenants.routes import bp as tenant_bp
    from app.tenants.self_service_routes import bp as self_service_bp
    from app.webhooks.routes import bp as webhooks_bp

    app.register_blueprint(health.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(metrics.bp)
    for blueprint in (intent_bp, tenant_bp, self_service_bp, webhooks_bp, admin_bp):
        app.register_blueprint(blueprint)


def register_commands(app):
    from app.admin.cli import admin_keys
    from app.intents.cli import intents
    from app.keyring.cli import secrets
    from app.tenants.cli import tenants
    from app.webhooks.cli import webhooks

    app.cli.add_command(tenants)
    app.cli.add_command(webhooks)
    app.cli.add_command(intents)
    app.cli.add_command(admin_keys)
    app.cli.add_command(secrets)
