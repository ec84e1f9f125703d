"""The one configured HTTP session through which the service calls the context store."""
import os

import requests
from flask import current_app
from requests.adapters import HTTPAdapter


class ContextStoreSession:
    """Holds a pooled requests.Session per process, made on first use after gunicorn forks."""

    def __init__(self):
        self._session = None
        self._pid = None

    def init_app(self, app):
        app.extensions["context_store"] = self

    @property
    def session(self):
        if self._session is None or self._pid != os.getpid():
            session = requests.Session()
            # No automatic retries: a retry would double the time budget of one request.
            adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            session.headers["User-Agent"] = "intentgate-context-client/1"
            session.trust_env = False
            self._session, self._pid = session, os.getpid()
        return self._session

    def post(self, url, **kwargs):
        config = current_app.config
        timeout = (config["CONTEXT_STORE_CONNECT_TIMEOUT"], config["CONTEXT_STORE_READ_TIMEOUT"])
        return self.session.post(url, timeout=timeout, **kwargs)
