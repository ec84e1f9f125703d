"""Key material: API keys and signing secrets are made, digested and sealed here only."""
import hashlib
import hmac
import logging
import os
import secrets
from contextlib import suppress
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from flask import current_app

from app.keyring import checks, ring

API_KEY_PREFIX = "key_live_"
SIGNING_SECRET_PREFIX = "sig_live_"
DISPLAY_PREFIX_LENGTH = len(API_KEY_PREFIX) + 6

log = logging.getLogger(__name__)


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


class SealedSecretError(RuntimeError):
    """A stored secret that no key of SECRET_ENCRYPTION_KEY unseals."""

    def __init__(self):
        super().__init__("a stored secret cannot be unsealed with any key of "
                         "SECRET_ENCRYPTION_KEY")


def seal(secret):
    """Seal a secret to be stored, with the ring's first key, which the database records."""
    checks.record_sealing_key()
    return ring.multi_fernet(_ring_text()).encrypt(secret.encode("utf-8")).decode("ascii")


def unseal(sealed):
    return _unseal(_ring_text(), sealed)


@lru_cache(maxsize=4096)
def _unseal(ring_text, sealed):
    # Keyed by the ciphertext: a rotated secret has a new ciphertext, so nothing stale is served.
    # Decrypting costs more than the verify's database round trip, hence the cache.
    try:
        return ring.multi_fernet(ring_text).decrypt(sealed.encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise SealedSecretError() from None


def grace_for(sealed, grace_seconds, **extra):
    """The grace a rotation gives the secret `sealed` it replaces: `grace_seconds`, or none
    for a secret that no key of the ring unseals (sealed with a key the database never
    recorded: every seal checks the ring holds those), which would make each use of it in the
    grace a 503, as it made the rotation needed."""
    if grace_seconds > 0:
        try:
            unseal(sealed)
        except SealedSecretError:
            log.warning("the secret being replaced cannot be unsealed with "
                        "SECRET_ENCRYPTION_KEY: rotated without a grace", extra=extra)
            return 0
    return grace_seconds


def reseal(sealed):
    """`sealed` sealed with the ring's first key instead, or None when it already is."""
    ring_text = _ring_text()
    token = sealed.encode("ascii")
    try:
        ring.fernet(ring.keys(ring_text)[0]).decrypt(token)
        return None
    except InvalidToken:
        pass
    try:
        return ring.multi_fernet(ring_text).rotate(token).decode("ascii")
    except InvalidToken:
        raise SealedSecretError() from None


def _ring_text():
    return current_app.config["SECRET_ENCRYPTION_KEY"]


def use_local_key_if_unset(config, instance_path):
    """Without SECRET_ENCRYPTION_KEY (embedded mode), the instance's own generated key."""
    config["LOCAL_ENCRYPTION_KEY"] = config["SECRET_ENCRYPTION_KEY"] is None
    if config["LOCAL_ENCRYPTION_KEY"]:
        config["SECRET_ENCRYPTION_KEY"] = local_encryption_key(instance_path)


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
