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


def client_network():
    """Who a per-address limit counts: the address for IPv4 (an IPv4-mapped IPv6 address as
    its IPv4 address), its /64 for IPv6. A host is given a whole /64 (a site a /48 or a /56,
    RFC 6177): counting each IPv6 address apart would hand one client 2^64 allowances."""
    try:
        address = ipaddress.ip_address(request.remote_addr or "")
    except ValueError:
        return UNKNOWN
    if address.version == 6 and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address.version == 6:
        return str(ipaddress.ip_network((address, 64), strict=False))
    return str(address)
