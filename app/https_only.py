"""HTTPS only in production: plain HTTP is refused and responses carry HSTS.

Whether a request came over TLS is request.is_secure: TLS terminated by gunicorn itself, or by a
trusted proxy's X-Forwarded-Proto (ProxyFix with TRUSTED_PROXY_HOPS); never an untrusted header.
"""
from flask import current_app, request

from app.errors import Forbidden

HSTS = "max-age=63072000; includeSubDomains"
# Load balancers probe health over plain HTTP inside the private network.
PLAIN_HTTP_ALLOWED = ("/health",)


def refuse_plain_http():
    if current_app.config["REQUIRE_TLS"] and not request.is_secure \
            and request.path not in PLAIN_HTTP_ALLOWED:
        raise Forbidden("HTTPS is required: this service does not accept plain HTTP")


def strict_transport(response):
    if current_app.config["REQUIRE_TLS"]:
        response.headers.add("Strict-Transport-Security", HSTS)  # no other code writes it
    return response
