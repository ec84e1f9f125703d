"""The client address used for per-address limits and the audit log.

ProxyFix (configured with TRUSTED_PROXY_HOPS in create_app) has already replaced remote_addr
with the address the trusted proxies saw, so no client-supplied header is trusted here.
"""
import ipaddress

from flask import request

UNKNOWN = "unknown"


def client_address():
    """The address in its canonical form. A proxy that passes a client's X-Forwarded-For on
    unchecked can make remote_addr any text: such callers share one address, "unknown", rather
    than naming a bucket or an audit entry (64 characters) themselves."""
    try:
        return str(ipaddress.ip_address(request.remote_addr or ""))
    except ValueError:
        return UNKNOWN
