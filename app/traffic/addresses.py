"""The client address used for per-address limits.

ProxyFix (configured with TRUSTED_PROXY_HOPS in create_app) has already replaced remote_addr
with the address the trusted proxies saw, so no client-supplied header is trusted here.
"""
from flask import request


def client_address():
    return request.remote_addr or "unknown"
