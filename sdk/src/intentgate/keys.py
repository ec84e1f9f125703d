"""Ed25519 key pairs for the `ed25519` response signature scheme.

The AI service keeps the private key; the tenant registers only the public key with the
service, so nothing the service stores can forge a response. No text raised from here ever
holds key material: messages name the kind of key, never its bytes.
"""
import base64
from dataclasses import dataclass, field

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x448, x25519

_KIND_NAMES = (
    (rsa.RSAPrivateKey, "an RSA key"),
    (ec.EllipticCurvePrivateKey, "an elliptic-curve (ECDSA) key"),
    (ed448.Ed448PrivateKey, "an Ed448 key"),
    (x25519.X25519PrivateKey, "an X25519 key"),
    (x448.X448PrivateKey, "an X448 key"),
)
_PUBLIC_KEY_TYPES = (ed25519.Ed25519PublicKey, rsa.RSAPublicKey, ec.EllipticCurvePublicKey,
                     ed448.Ed448PublicKey, x25519.X25519PublicKey, x448.X448PublicKey)
NOT_A_PRIVATE_KEY = ("private_key must be an Ed25519 private key: PEM text (PKCS#8, "
                     "'-----BEGIN PRIVATE KEY-----') or a cryptography Ed25519PrivateKey")


class InvalidSigningKey(ValueError):
    """The private key given to an Ed25519 signer cannot sign (its text never holds the key)."""


@dataclass(frozen=True)
class Ed25519KeyPair:
    """A fresh key pair: keep `private_key_pem` on the AI service, register `public_key`.

    Unpacks as `private_key_pem, public_key = generate_ed25519_key_pair()`; its repr leaves
    the private key out, so printing or logging the pair does not leak it."""

    private_key_pem: str = field(repr=False)
    public_key: str

    @property
    def public_key_pem(self):
        """The public key as PEM SubjectPublicKeyInfo (the service accepts either form)."""
        key = load_ed25519_private_key(self.private_key_pem).public_key()
        return key.public_bytes(serialization.Encoding.PEM,
                                serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")

    def __iter__(self):
        return iter((self.private_key_pem, self.public_key))


def generate_ed25519_key_pair():
    """Make a key pair: the private key as PKCS#8 PEM, the public key as base64 of 32 bytes."""
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode("ascii")
    raw_public = key.public_key().public_bytes(serialization.Encoding.Raw,
                                               serialization.PublicFormat.Raw)
    return Ed25519KeyPair(private_pem, base64.b64encode(raw_public).decode("ascii"))


def load_ed25519_private_key(private_key):
    """An Ed25519PrivateKey from PEM text (str or bytes) or from such a key object.

    Anything else is a TypeError (a wrong kind of object) or InvalidSigningKey (PEM that does
    not hold an unencrypted Ed25519 private key)."""
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        return private_key
    if isinstance(private_key, _PUBLIC_KEY_TYPES):
        raise TypeError("private_key is a public key, which cannot sign: pass the private key "
                        "(register the public key with the service)")
    kind = _kind_of(private_key)
    if kind:
        raise TypeError(f"private_key is {kind}; the ed25519 scheme needs an Ed25519 key")
    if isinstance(private_key, str):
        pem = private_key.encode("utf-8", "replace")  # PEM is ASCII: a stray character fails below
    elif isinstance(private_key, (bytes, bytearray, memoryview)):
        pem = bytes(private_key)
    else:
        raise TypeError(f"{NOT_A_PRIVATE_KEY}, not {type(private_key).__name__}")
    return _load_pem(pem)


def _load_pem(pem):
    if b"-----BEGIN" not in pem:
        raise InvalidSigningKey(f"{NOT_A_PRIVATE_KEY}; this is not PEM text")
    if b"PUBLIC KEY-----" in pem and b"PRIVATE KEY-----" not in pem:
        raise InvalidSigningKey("private_key is a public key, which cannot sign: pass the private "
                                "key (register the public key with the service)")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # cryptography's way of saying the PEM is encrypted
        raise InvalidSigningKey("private_key is an encrypted PEM: give the unencrypted PKCS#8 "
                                "PEM (or a cryptography Ed25519PrivateKey)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise InvalidSigningKey(f"{NOT_A_PRIVATE_KEY}; this PEM could not be read") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise InvalidSigningKey(
            f"private_key is {_kind_of(key) or 'not an Ed25519 key'}; the ed25519 scheme needs "
            "an Ed25519 key")
    return key


def _kind_of(key):
    for kind, name in _KIND_NAMES:
        if isinstance(key, kind):
            return name
    return None
