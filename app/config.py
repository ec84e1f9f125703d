"""Settings, read once from the environment and checked before the app serves anything.

Every setting has a typed parser; a bad value stops start-up with a message naming the variable,
so a misconfigured worker never comes up half-working.
"""
import os
from urllib.parse import urlsplit

from cryptography.fernet import Fernet
from limits import parse as parse_rate_limit


class ConfigError(RuntimeError):
    """A setting is missing or malformed."""


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
        raise ConfigError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def _number(name, default, minimum=0.0):
    raw = _text(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _flag(name, default):
    raw = _text(name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


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
        "REDIS_SOCKET_TIMEOUT": _number("REDIS_SOCKET_TIMEOUT", 0.5),
        "RATE_LIMIT_STORE_FAILURE": _text("RATE_LIMIT_STORE_FAILURE", "closed"),
        "RATE_LIMIT_FAIL_OPEN_SECONDS": _integer("RATE_LIMIT_FAIL_OPEN_SECONDS", 60, minimum=0),
        "CONTEXT_STORE_URL": _text("CONTEXT_STORE_URL"),
        "CONTEXT_STORE_CONNECT_TIMEOUT": _number("CONTEXT_STORE_CONNECT_TIMEOUT", 5.0),
        "CONTEXT_STORE_READ_TIMEOUT": _number("CONTEXT_STORE_READ_TIMEOUT", 20.0),
        "TAXONOMY_PATH": _text("TAXONOMY_PATH"),
        "CORS_ORIGINS": _origins("CORS_ORIGINS"),
        "SECRET_ENCRYPTION_KEY": _text("SECRET_ENCRYPTION_KEY"),
        "MULTI_TENANCY": _flag("MULTI_TENANCY", True),
        "CLOCK_SKEW_SECONDS": _integer("CLOCK_SKEW_SECONDS", 60, minimum=0, maximum=3600),
        "RATE_LIMIT_CAPACITY": _integer("RATE_LIMIT_CAPACITY", 100, minimum=1),
        "RATE_LIMIT_REFILL_PER_MINUTE": _integer("RATE_LIMIT_REFILL_PER_MINUTE", 100, minimum=1),
        "AUTH_FAILURE_LIMIT": _text("AUTH_FAILURE_LIMIT", "20 per minute"),
        "TRUSTED_PROXY_HOPS": _integer("TRUSTED_PROXY_HOPS", 0, minimum=0, maximum=5),
        "SMTP_HOST": _text("SMTP_HOST"),
        "SMTP_PORT": _integer("SMTP_PORT", 25, minimum=1, maximum=65535),
        "SMTP_USERNAME": _text("SMTP_USERNAME"),
        "SMTP_PASSWORD": _text("SMTP_PASSWORD"),
        "SMTP_STARTTLS": _flag("SMTP_STARTTLS", False),
        "SMTP_TIMEOUT": _number("SMTP_TIMEOUT", 10.0),
        "MAIL_FROM": _text("MAIL_FROM", "keys@intentgate.local"),
        "LOG_LEVEL": _text("LOG_LEVEL", "INFO").upper(),
        "REQUIRE_TLS": _flag("REQUIRE_TLS", None),  # unset: on in production (see validate)
        "METRICS_ENABLED": _flag("METRICS_ENABLED", False),
        "MAX_CONTENT_LENGTH": 64 * 1024,
    }


def normalize_database_url(url):
    """Pin PostgreSQL URLs to psycopg2 (SQLAlchemy 2.1 would otherwise pick psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix):]
    return url


def validate(config):
    """Fail fast on settings that cannot work together."""
    config["SQLALCHEMY_DATABASE_URI"] = normalize_database_url(config["SQLALCHEMY_DATABASE_URI"])
    if config["DEPLOYMENT_MODE"] not in ("local", "production"):
        raise ConfigError("DEPLOYMENT_MODE must be 'local' or 'production'")
    if config["REQUIRE_TLS"] is None:
        config["REQUIRE_TLS"] = config["DEPLOYMENT_MODE"] == "production"
    if config["RATE_LIMIT_STORE_FAILURE"] not in ("closed", "open"):
        raise ConfigError("RATE_LIMIT_STORE_FAILURE must be 'closed' or 'open'")
    scheme = urlsplit(config["SQLALCHEMY_DATABASE_URI"]).scheme
    if not scheme.startswith(("sqlite", "postgresql")):
        raise ConfigError("DATABASE_URL must be a sqlite:// or postgresql:// URL")
    for name in ("REDIS_URL", "CONTEXT_STORE_URL"):
        url = config[name]
        if url is not None and not urlsplit(url).scheme:
            raise ConfigError(f"{name} must be an absolute URL")
    try:
        parse_rate_limit(config["AUTH_FAILURE_LIMIT"])
    except ValueError:
        raise ConfigError("AUTH_FAILURE_LIMIT must look like '20 per minute'") from None
    key = config["SECRET_ENCRYPTION_KEY"]
    if key is None:
        if config["DEPLOYMENT_MODE"] == "production":
            raise ConfigError("SECRET_ENCRYPTION_KEY is required in production")
    else:
        try:
            Fernet(key)
        except ValueError:
            raise ConfigError(
                "SECRET_ENCRYPTION_KEY must be a Fernet key (32 url-safe base64-encoded bytes)"
            ) from None
