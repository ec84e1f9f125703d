"""Key material: API keys and signing secrets are made, digested and sealed here only."""
import hashlib
import hmac
import os
import secrets
from contextlib import suppress
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from flask import current_app

API_KEY_PREFIX = "key_live_"
SIGNING_SECRET_PREFIX = "sig_live_"
DISPLAY_PREFIX_LENGTH = len(API_KEY_PREFIX) + 6


def new_api_key():
    return API_KEY_PREFIX + secrets.token_hex(24)


def new_signing_secret():
    return SIGNING_SECRET_PREFIX + secrets.token_hex(32)


def key_digest(api_key):
    """SHA-256 hex digest: the only form in which an API key is stored or looked up."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def display_prefix(api_key):
    return api_key[:DISPLAY_PREFIX_LENGTH]


def digests_match(expected, actual):
    return hmac.compare_digest(expected.encode("ascii"), actual.encode("ascii"))


def _fernet():
    return Fernet(current_app.config["SECRET_ENCRYPTION_KEY"])


def seal(secret):
    return _fernet().encrypt(secret.encode("utf-8")).decode("ascii")


def unseal(sealed):
    return _unseal(current_app.config["SECRET_ENCRYPTION_KEY"], sealed)


@lru_cache(maxsize=4096)
def _unseal(encryption_key, sealed):
    # Keyed by the ciphertext: a rotated secret has a new ciphertext, so nothing stale is served.
    # Decrypting costs more than the verify's database round trip, hence the cache.
    try:
        return Fernet(encryption_key).decrypt(sealed.encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise RuntimeError("a stored secret cannot be decrypted with SECRET_ENCRYPTION_KEY") from None


def local_encryption_key(instance_path):
    """Return the embedded mode's encryption key, creating it once for all workers."""
    os.makedirs(instance_path, exist_ok=True)
    path = os.path.join(instance_path, "secret-encryption.key")
    if not os.path.exists(path):
        # Written aside and linked into place, so a concurrent worker never reads a half file.
        draft = f"{path}.{os.getpid()}"
        with open(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
            out.write(Fernet.generate_key())
        try:
            with suppress(FileExistsError):  # another worker linked its key first: use that one
                os.link(draft, path)
        finally:
            os.unlink(draft)
    with open(path, "rb") as stored:
        return stored.read().strip().decode("ascii")
