"""The ring itself, parsed from SECRET_ENCRYPTION_KEY: no database here."""
import base64
import hashlib
import hmac
from functools import lru_cache

from cryptography.fernet import Fernet, MultiFernet

# What a key check value is computed from. Changing it orphans every recorded value.
CHECK_CONSTANT = b"intentgate secret key check v1"


def keys(ring_text):
    """The keys of a ring, first (the sealing key) first."""
    return [key.strip() for key in ring_text.split(",")]


@lru_cache(maxsize=8)
def multi_fernet(ring_text):
    return MultiFernet([Fernet(key) for key in keys(ring_text)])


@lru_cache(maxsize=64)
def fernet(key):
    return Fernet(key)


def check_value(key):
    """A value that says which key sealed secrets, from which the key cannot be learned:
    HMAC-SHA256 of a fixed text under the key (64 hex digits)."""
    return hmac.new(base64.urlsafe_b64decode(key), CHECK_CONSTANT, hashlib.sha256).hexdigest()


@lru_cache(maxsize=8)
def check_values(ring_text):
    """The check value of each key of the ring, in ring order (the first is the sealing key's)."""
    return tuple(check_value(key) for key in keys(ring_text))
