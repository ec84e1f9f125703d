"""Watch every test for secrets at rest: collect each user token, API key and signing secret
that crosses the app, and any private key material sent in place of a public key; then check
the database dump and the log output contain none of them, and no response echoes private key
material."""
import base64
import binascii
import io
import logging

from flask import request_finished, request_started

from app.logs import JsonLineFormatter

SECRET_FIELDS = ("api_key", "signing_secret", "new_key", "secret")
PRIVATE_KEY_MARKER = "PRIVATE KEY-----"


def private_key_material(value):
    """The pieces of a private key in `value` worth watching: the base64 lines of a PEM private
    key, or a bare base64 key of 64 bytes (libsodium's seed and public key)."""
    if not isinstance(value, str):
        return []
    if PRIVATE_KEY_MARKER in value:
        return [line for line in value.splitlines() if line and "-----" not in line]
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return []
    return [value.strip(), base64.b64encode(raw[:32]).decode()] if len(raw) == 64 else []


def _worth_watching(value):
    # Short or low-entropy strings ("aaaaaaaaaa") could match hex digests by chance.
    return isinstance(value, str) and len(value) >= 10 and len(set(value)) >= 6


class LeakWatch:
    def __init__(self):
        self.secrets = set()
        self._private = set()
        self.response_leaks = []
        # Fuzz tests send generated strings ("request_id..." included) that are no secrets and
        # would match ordinary log text; they turn this off and register real credentials only.
        self.watch_requests = True
        self.buffer = io.StringIO()
        self.handler = logging.StreamHandler(self.buffer)
        self.handler.setFormatter(JsonLineFormatter())
        self.handler.setLevel(logging.DEBUG)

    def watch(self, app):
        request_started.connect(self._on_request, app)
        request_finished.connect(self._on_response, app)
        logging.getLogger().addHandler(self.handler)
        self.app = app

    def add(self, *values):
        self.secrets.update(value for value in values if _worth_watching(value))

    def _on_request(self, sender, **extra):
        from flask import request

        if not self.watch_requests:
            return
        self.add(request.headers.get("X-Service-Key"))
        if (request.content_length or 0) > sender.config["MAX_CONTENT_LENGTH"]:
            return  # reading it here would answer 413 before the app's own hooks ran
        body = request.get_json(silent=True, cache=True)
        if isinstance(body, dict):
            self.add(body.get("user_token"))
            self.add_private(body.get("public_key"))

    def _on_response(self, sender, response, **extra):
        body = response.get_json(silent=True) if response.is_json else None
        if isinstance(body, dict):
            self.add(*(body.get(field) for field in SECRET_FIELDS))
        text = response.get_data(as_text=True) if not response.is_streamed else ""
        if PRIVATE_KEY_MARKER in text or any(
                piece in text for piece in self.private_pieces()):
            self.response_leaks.append(response.status)

    def private_pieces(self):
        return [secret for secret in self.secrets if secret in self._private]

    def add_private(self, *values):
        """Private key material: watched in the database, the logs and every response."""
        pieces = [piece for value in values for piece in private_key_material(value)]
        self._private.update(pieces)
        self.add(*pieces)

    def leaks_in(self, text):
        leaks = sorted(secret[:12] + "..." for secret in self.secrets if secret in text)
        return leaks + (["a private key"] if PRIVATE_KEY_MARKER in text else [])

    def close(self):
        request_started.disconnect(self._on_request, self.app)
        request_finished.disconnect(self._on_response, self.app)
        logging.getLogger().removeHandler(self.handler)
