"""Settings, read once from the environment and checked before the app serves anything.

Every setting has a typed parser; a bad value stops start-up with a message naming the variable,
so a misconfigured worker never comes up half-working.
"""
import base64
import logging
import math
import os
import re
import sys
from contextlib import contextmanager
from urllib.parse import parse_qs, urlsplit

from cryptography.fernet import Fernet
from limits import parse as parse_rate_limit
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError


class ConfigError(RuntimeError):
    """A setting is missing or malformed."""


class KeyRingMismatch(ConfigError):
    """SECRET_ENCRYPTION_KEY lacks a key that sealed secrets in the database."""


# gunicorn's "worker failed to boot" status: a worker exiting with it stops the master instead of
# being respawned in a loop. Any non-zero status does for the flask CLI.
CONFIG_ERROR_EXIT_STATUS = 3

# SPEC.md's request timeout: the context store's deadline stays inside it, and a database
# statement still unanswered when it has passed is cut (app.statement_deadline).
REQUEST_SECONDS = 30
# The longest a worker answers generate 502 without asking a silent context store
# (app.context_store.breaker); CONTEXT_STORE_BREAK_SECONDS, the first break, is at most this.
CONTEXT_STORE_MAX_BREAK_SECONDS = 60.0


@contextmanager
def exit_on_config_error():
    """Stop the process with one line naming the setting, not a traceback (entry points only)."""
    try:
        yield
    except ConfigError as error:
        print(f"Configuration error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(CONFIG_ERROR_EXIT_STATUS) from None


def _text(name, default=None):
    value = os.environ.get(name)
    return default if value is None or value.strip() == "" else value.strip()


def _integer(name, default, minimum=None, maximum=None):
    raw = _text(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            raise ConfigError(f"{name} must be at least {minimum}, got {value}")
        raise ConfigError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def _seconds(name, default, maximum=math.inf):
    """A timeout or an interval: a finite number of seconds above 0 (and at most `maximum`). A
    timeout of 0 makes a socket fail every call at once (REDIS_SOCKET_TIMEOUT=0 answered every
    request 503 with Redis healthy), and an interval of 0 turns a worker's wait into a busy
    loop."""
    raw = _text(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 < value < math.inf:
        raise ConfigError(f"{name} must be more than 0 seconds, got {raw!r}")
    if value > maximum:
        raise ConfigError(f"{name} must be at most {maximum:g} seconds, got {raw!r}")
    return value


def flag(name, default):
    raw = _text(name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _delays(name, default):
    """Seconds, comma-separated (the retry schedule)."""
    raw = _text(name)
    if raw is None:
        return default
    try:
        delays = tuple(float(part) for part in raw.split(","))
    except ValueError:
        raise ConfigError(f"{name} must be seconds separated by commas, got {raw!r}") from None
    if not all(0 <= delay < math.inf for delay in delays):  # nan and inf compare false
        raise ConfigError(f"{name} must hold finite delays of 0 seconds or more, got {raw!r}")
    return delays


# CONTRACT.md, Webhooks: retried after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, then given up.
WEBHOOK_RETRY_DELAYS = (5, 300, 1800, 7200, 18000, 36000, 36000)


# A browser origin: scheme, host and optional port, nothing else. Flask-CORS reads an entry
# holding any of *?$^[]()\\ as a regular expression matched at the start of the Origin, so
# "https://*.acme.example" would allow "https://xacme.example.evil.com": such an entry is
# refused, not guessed at.
ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?")


def _origins(name):
    raw = _text(name, "")
    return [origin.strip() for origin in raw.split(",") if origin.strip()]


def from_environment(instance_path):
    """Return the settings dictionary for this process."""
    mode = _text("DEPLOYMENT_MODE", "local")
    return {
        "DEPLOYMENT_MODE": mode,
        "SQLALCHEMY_DATABASE_URI": _text(
            "DATABASE_URL", "sqlite:///" + os.path.join(instance_path, "intentgate.db")
        ),
        "REDIS_URL": _text("REDIS_URL"),
        "REDIS_SOCKET_TIMEOUT": _seconds("REDIS_SOCKET_TIMEOUT", 0.5),
        "RATE_LIMIT_STORE_FAILURE": _text("RATE_LIMIT_STORE_FAILURE", "closed"),
        "RATE_LIMIT_FAIL_OPEN_SECONDS": _integer("RATE_LIMIT_FAIL_OPEN_SECONDS", 60, minimum=0),
        "CONTEXT_STORE_URL": _text("CONTEXT_STORE_URL"),
        "CONTEXT_STORE_CONNECT_TIMEOUT": _seconds("CONTEXT_STORE_CONNECT_TIMEOUT", 5.0),
        "CONTEXT_STORE_READ_TIMEOUT": _seconds("CONTEXT_STORE_READ_TIMEOUT", 20.0),
        "CONTEXT_STORE_DEADLINE": _seconds("CONTEXT_STORE_DEADLINE", 25.0),
        # Doubling while the store stays silent, up to a minute: a first break longer than
        # that would shut a store that blipped once out for longer than one that hangs.
        "CONTEXT_STORE_BREAK_SECONDS": _seconds("CONTEXT_STORE_BREAK_SECONDS", 5.0,
                                                maximum=CONTEXT_STORE_MAX_BREAK_SECONDS),
        "TAXONOMY_PATH": _text("TAXONOMY_PATH"),
        "CORS_ORIGINS": _origins("CORS_ORIGINS"),
        "SECRET_ENCRYPTION_KEY": _text("SECRET_ENCRYPTION_KEY"),
        "MULTI_TENANCY": flag("MULTI_TENANCY", True),
        "CLOCK_SKEW_SECONDS": _integer("CLOCK_SKEW_SECONDS", 60, minimum=0, maximum=3600),
        "RATE_LIMIT_CAPACITY": _integer("RATE_LIMIT_CAPACITY", 100, minimum=1),
        "RATE_LIMIT_REFILL_PER_MINUTE": _integer("RATE_LIMIT_REFILL_PER_MINUTE", 100, minimum=1),
        "AUTH_FAILURE_LIMIT": _text("AUTH_FAILURE_LIMIT", "20 per minute"),
        "TRUSTED_PROXY_HOPS": _integer("TRUSTED_PROXY_HOPS", 0, minimum=0, maximum=5),
        "SMTP_HOST": _text("SMTP_HOST"),
        "SMTP_PORT": _integer("SMTP_PORT", 25, minimum=1, maximum=65535),
        "SMTP_USERNAME": _text("SMTP_USERNAME"),
        "SMTP_PASSWORD": _text("SMTP_PASSWORD"),
        "SMTP_STARTTLS": flag("SMTP_STARTTLS", False),
        "SMTP_TIMEOUT": _seconds("SMTP_TIMEOUT", 10.0),
        "MAIL_FROM": _text("MAIL_FROM", "keys@intentgate.local"),
        "LOG_LEVEL": _text("LOG_LEVEL", "INFO").upper(),
        "REQUIRE_TLS": flag("REQUIRE_TLS", None),  # unset: on in production (see validate)
        "METRICS_ENABLED": flag("METRICS_ENABLED", False),
        "MAX_CONTENT_LENGTH": 64 * 1024,
        # How long a request's statement may wait for PostgreSQL's answer before it is cut
        # (503): above the 5 s a statement may wait for a lock (app.database.LOCK_TIMEOUT), and
        # short enough that a generate whose context store took its whole deadline still
        # answers before gunicorn's worker timeout; capped by SPEC.md's 30 s request budget.
        "DATABASE_STATEMENT_SECONDS": 10.0,
        # Webhooks (app/webhooks): private addresses and http:// for development and tests only.
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": flag("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", False),
        "WEBHOOK_CONNECT_TIMEOUT": _seconds("WEBHOOK_CONNECT_TIMEOUT", 5.0),
        "WEBHOOK_TIMEOUT": _seconds("WEBHOOK_TIMEOUT", 15.0),
        # Longer than an attempt may last: a dead worker's attempt is made again after it.
        "WEBHOOK_LEASE_SECONDS": _integer("WEBHOOK_LEASE_SECONDS", 60, minimum=1),
        "WEBHOOK_RETRY_DELAYS": _delays("WEBHOOK_RETRY_DELAYS", WEBHOOK_RETRY_DELAYS),
        "WEBHOOK_POLL_SECONDS": _seconds("WEBHOOK_POLL_SECONDS", 1.0),
        "WEBHOOK_SWEEP_SECONDS": _seconds("WEBHOOK_SWEEP_SECONDS", 300.0),
        "WEBHOOK_CA_FILE": _text("WEBHOOK_CA_FILE"),
    }


def normalize_database_url(url):
    """Pin PostgreSQL URLs to psycopg2 (SQLAlchemy 2.1 would otherwise pick psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix):]
    return url


# The dialects and drivers the service is built and tested for (psycopg2: see above).
DATABASE_DRIVERS = {"sqlite": ("", "pysqlite"), "postgresql": ("psycopg2",)}


def _not_a_url(name):
    # Not the URL itself in the message: it may hold a password.
    return ConfigError(f"{name} is not a valid URL (check its host, port and percent-encoding)")


def _split(name, url):
    """urlsplit, whose ValueError ("Invalid IPv6 URL" for a lone "[") is one line naming the
    setting."""
    try:
        return urlsplit(url)
    except ValueError:
        raise _not_a_url(name) from None


def _check_port(name, parts):
    try:
        parts.port  # noqa: B018 - parsing is the check
    except ValueError:
        raise ConfigError(f"{name}'s port must be a number between 0 and 65535") from None


def check_database_url(url):
    problem = ConfigError("DATABASE_URL must be a sqlite:// or postgresql:// URL")
    dialect, _, driver = _split("DATABASE_URL", url).scheme.lower().partition("+")
    if driver not in DATABASE_DRIVERS.get(dialect, ()):
        raise problem
    try:
        make_url(url).port  # noqa: B018 - parsing is the check; a port must be a number
    except (ArgumentError, ValueError):
        raise _not_a_url("DATABASE_URL") from None


def check_context_store_url(url):
    """An http:// or https:// URL with a host and, if any, a numeric port: anything else
    would start, then answer every generate 502."""
    parts = _split("CONTEXT_STORE_URL", url)
    _check_port("CONTEXT_STORE_URL", parts)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError("CONTEXT_STORE_URL must be an absolute http:// or https:// URL "
                          "with a host")
    if parts.username is not None or parts.password is not None:
        # requests would send them as Basic credentials in place of the user's token.
        raise ConfigError("CONTEXT_STORE_URL must not hold a user name or password: the "
                          "user's token is what the store is sent (Authorization: Bearer)")


REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "redis+sentinel")


def check_redis_url(url):
    """Refuse what redis-py would ignore or fail on later (`/abc` was quietly database 0)."""
    parts = _split("REDIS_URL", url)
    scheme = parts.scheme.lower()
    if scheme not in REDIS_SCHEMES:
        raise ConfigError("REDIS_URL must be a redis://, rediss://, redis+cluster:// or "
                          "redis+sentinel:// URL")
    if scheme == "redis+cluster":
        return  # its nodes are checked by redis_cluster_nodes
    if not parts.netloc:
        raise ConfigError("REDIS_URL must name a host")
    if scheme == "redis+sentinel":
        if not parts.path.strip("/"):  # the monitored master's name
            raise ConfigError("REDIS_URL must look like redis+sentinel://host:port"
                              "[,host:port...]/service-name")
        return  # the rest is the Sentinel client's to read
    _check_port("REDIS_URL", parts)
    index = parts.path.strip("/")
    queried = parse_qs(parts.query).get("db")
    if queried:
        index = queried[0]
    if index and not (index.isascii() and index.isdigit()):
        raise ConfigError(f"REDIS_URL's database index must be a number, got {index!r}")


REDIS_CLUSTER_SCHEME = "redis+cluster://"


def redis_cluster_nodes(url):
    """The (host, port) startup nodes of `redis+cluster://host:port[,host:port...]`, or None
    when REDIS_URL names a single Redis."""
    if url is None or not url.lower().startswith(REDIS_CLUSTER_SCHEME):
        return None
    problem = ConfigError("REDIS_URL must look like redis+cluster://host:port[,host:port...]")
    nodes = []
    for node in url[len(REDIS_CLUSTER_SCHEME):].rstrip("/").split(","):
        host, _, port = node.strip().rpartition(":")
        if not host or "/" in host or "@" in host or not (port.isascii() and port.isdigit()):
            raise problem
        if not 0 < int(port) < 65536:
            raise problem
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def validate(config):
    """Fail fast on settings that cannot work together."""
    config["SQLALCHEMY_DATABASE_URI"] = normalize_database_url(config["SQLALCHEMY_DATABASE_URI"])
    if config["DEPLOYMENT_MODE"] not in ("local", "production"):
        raise ConfigError("DEPLOYMENT_MODE must be 'local' or 'production'")
    if config["REQUIRE_TLS"] is None:
        config["REQUIRE_TLS"] = config["DEPLOYMENT_MODE"] == "production"
    # The names logging itself takes (WARN and FATAL too, as before this check).
    if config["LOG_LEVEL"] not in logging.getLevelNamesMapping():
        raise ConfigError("LOG_LEVEL must be a level name of Python's logging (DEBUG, INFO, "
                          f"WARNING, ERROR, CRITICAL), got {config['LOG_LEVEL']!r}")
    for origin in config["CORS_ORIGINS"]:
        if not ORIGIN.fullmatch(origin):
            raise ConfigError("CORS_ORIGINS must list origins such as https://app.example.com "
                              f"(scheme, host and port; no wildcard or path), got {origin!r}")
    if config["RATE_LIMIT_STORE_FAILURE"] not in ("closed", "open"):
        raise ConfigError("RATE_LIMIT_STORE_FAILURE must be 'closed' or 'open'")
    check_database_url(config["SQLALCHEMY_DATABASE_URI"])
    if config["REDIS_URL"] is not None:
        check_redis_url(config["REDIS_URL"])
    if config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] and config["DEPLOYMENT_MODE"] == "production":
        # It turns off the webhook SSRF filter: tenants' URLs could reach this network.
        raise ConfigError("WEBHOOK_ALLOW_PRIVATE_ADDRESSES is for development and tests: not in "
                          "production")
    ca_file = config["WEBHOOK_CA_FILE"]
    if ca_file is not None and not (os.path.isfile(ca_file) and os.access(ca_file, os.R_OK)):
        raise ConfigError(f"WEBHOOK_CA_FILE names no readable file: {ca_file}")
    if config["CONTEXT_STORE_URL"] is not None:
        check_context_store_url(config["CONTEXT_STORE_URL"])
    config["REDIS_CLUSTER_NODES"] = redis_cluster_nodes(config["REDIS_URL"])
    if config["WEBHOOK_LEASE_SECONDS"] <= config["WEBHOOK_TIMEOUT"]:
        raise ConfigError("WEBHOOK_LEASE_SECONDS must be longer than WEBHOOK_TIMEOUT (an "
                          "attempt in flight would be made twice)")
    if not 0 < config["CONTEXT_STORE_DEADLINE"] < REQUEST_SECONDS:
        raise ConfigError("CONTEXT_STORE_DEADLINE must be more than 0 and less than "
                          f"{REQUEST_SECONDS} seconds")
    try:
        parse_rate_limit(config["AUTH_FAILURE_LIMIT"])
    except ValueError:
        raise ConfigError("AUTH_FAILURE_LIMIT must look like '20 per minute'") from None
    key = config["SECRET_ENCRYPTION_KEY"]
    if key is None:
        if config["DEPLOYMENT_MODE"] == "production":
            raise ConfigError("SECRET_ENCRYPTION_KEY is required in production")
    else:
        check_key_ring(key)


# A Fernet key exactly: 32 bytes in url-safe base64. Fernet's own check decodes leniently,
# dropping what is not base64 and whatever follows the padding, so "new;old" or "new old" (a
# ring with the wrong separator) would pass as the key "new" alone, the old key silently lost.
FERNET_KEY = re.compile(r"[A-Za-z0-9_-]{43}=")


def check_key_ring(ring_text):
    """One Fernet key, or several separated by commas: the first seals, all unseal."""
    keys = [key.strip() for key in ring_text.split(",")]
    seen = []
    for position, key in enumerate(keys, start=1):
        try:
            if not FERNET_KEY.fullmatch(key):
                raise ValueError("not a Fernet key")
            Fernet(key)
        except ValueError:
            which = "" if "," not in ring_text else f": key {position} of the ring is not one"
            raise ConfigError("SECRET_ENCRYPTION_KEY must be a Fernet key (32 url-safe "
                              f"base64-encoded bytes), or several separated by commas{which}"
                              ) from None
        # "new,old" with the same key twice: a rotation that made no new key. Compared as the
        # bytes, not the text: the 43rd character's two low bits decode to nothing, so four
        # spellings are one key.
        material = base64.urlsafe_b64decode(key)
        if material in seen:
            raise ConfigError(f"SECRET_ENCRYPTION_KEY: key {position} of the ring repeats key "
                              f"{seen.index(material) + 1}")
        seen.append(material)
