"""Container health check (the Dockerfile's HEALTHCHECK; python-slim has no curl): GET /health on
gunicorn's own bind and exit 0 when it answers 200, 1 otherwise."""
import os
import ssl
import sys
import urllib.request


def health_url():
    # Unset or empty, gunicorn.conf.py binds the loopback default.
    address = (os.environ.get("GUNICORN_BIND") or "").strip() or "127.0.0.1:8000"
    address = address.split(",")[0].strip()
    host, _, port = address.rpartition(":")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "[::]":
        host = "[::1]"
    scheme = "https" if os.environ.get("TLS_CERTFILE") else "http"
    return f"{scheme}://{host}:{port}/health"


def main():
    # The certificate names the public host, not the loopback address this probe uses, and the
    # probe sends nothing secret: check that the service answers, not who it is.
    context = ssl._create_unverified_context() if os.environ.get("TLS_CERTFILE") else None
    url = health_url()
    try:
        with urllib.request.urlopen(url, timeout=4, context=context) as response:
            if response.status == 200:
                return 0
            print(f"{url} answered {response.status}", file=sys.stderr)
    except (OSError, ValueError) as error:
        print(f"{url}: {error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
