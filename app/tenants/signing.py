"""How a tenant's AI service signs responses: the scheme, its Ed25519 public keys, and moving
between schemes without downtime. Shared by the tenant API, the admin API and the CLI; the caller
owns the transaction.
"""
import base64
import binascii
import logging
import re
import secrets

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519
from nacl.bindings import crypto_core_ed25519_is_valid_point
from sqlalchemy import func, or_, select

from app.clock import expiry, now_seconds
from app.errors import BadRequest, Conflict, NotFound
from app.extensions import db
from app.tenants import audit
from app.tenants.tenant_row import existing_tenant, locked_tenant
from app.tenants.models import SigningKey

log = logging.getLogger(__name__)

MAX_ACTIVE_KEYS = 5
NOT_A_PUBLIC_KEY = ("public_key must be an Ed25519 public key: standard base64 of its 32 raw "
                    "bytes, or PEM (SubjectPublicKeyInfo, '-----BEGIN PUBLIC KEY-----')")
# Said without echoing anything of what was sent: it must not reach a log or a response.
PRIVATE_KEY = ("public_key holds a private key: it was not stored. Register only the public "
               "key; the private key stays with your AI service (consider this one exposed)")
# A point of small order (the identity, say) verifies a fixed forged signature over any message:
# such a "public key" would let anyone clear any response.
WEAK_KEY = ("public_key is not usable: it is a point of small order or outside the prime-order "
            "subgroup, with which anyone could forge signatures")
# Exactly one PEM block of base64 and nothing around it: OpenSSL would read the first of two
# blocks, or a block followed by anything, and store a key other than the one a reader sees.
_ONE_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----[A-Za-z0-9+/=\s]+-----END \1-----")
NEEDS_A_KEY = "the ed25519 scheme needs an active signing key: add one first"
LAST_KEY = "this is the last active signing key of a tenant on the ed25519 scheme"
TOO_MANY = f"a tenant holds at most {MAX_ACTIVE_KEYS} active signing keys: revoke one first"
ALREADY_REGISTERED = "this public key is already registered"
_OTHER_KINDS = ((rsa.RSAPublicKey, "an RSA key"), (ec.EllipticCurvePublicKey, "an ECDSA key"),
                (ed448.Ed448PublicKey, "an Ed448 key"), (x25519.X25519PublicKey, "an X25519 key"))


def parse_public_key(text):
    """Return the key as base64 of its 32 raw bytes, or raise 400 with a clear text."""
    text = text.strip()
    if "PRIVATE KEY" in text:  # PKCS#8, SEC1, PKCS#1 and OpenSSH private keys alike
        raise BadRequest(PRIVATE_KEY)
    if text.startswith("-----BEGIN"):
        raw = _raw_from_pem(text)
    else:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(NOT_A_PUBLIC_KEY) from None
        if len(raw) == 64:  # libsodium's secret key: the 32-byte seed, then the public key
            raise BadRequest(PRIVATE_KEY)
        if len(raw) != 32:
            raise BadRequest(NOT_A_PUBLIC_KEY)
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            raise BadRequest(NOT_A_PUBLIC_KEY) from None
    # OpenSSL's verify (RFC 8032) takes any point; libsodium checks that this one is encoded
    # canonically, lies in the prime-order subgroup and is not of small order.
    if not crypto_core_ed25519_is_valid_point(raw):
        raise BadRequest(WEAK_KEY)
    return base64.b64encode(raw).decode("ascii")


def _raw_from_pem(text):
    if not _ONE_PEM_BLOCK.fullmatch(text):
        raise BadRequest(NOT_A_PUBLIC_KEY)
    try:
        key = serialization.load_pem_public_key(text.encode("utf-8"))
    except (ValueError, UnsupportedAlgorithm, UnicodeError):
        raise BadRequest(NOT_A_PUBLIC_KEY) from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        kind = next((name for cls, name in _OTHER_KINDS if isinstance(key, cls)), "another kind")
        raise BadRequest(f"public_key is {kind}; only Ed25519 public keys are accepted")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _active(now):
    return (SigningKey.revoked_at.is_(None),
            or_(SigningKey.expires_at.is_(None), SigningKey.expires_at > now))


def _active_count(tenant_id, now):
    return db.session.execute(
        select(func.count()).select_from(SigningKey)
        .where(SigningKey.tenant_id == tenant_id, *_active(now))
    ).scalar_one()


def add_signing_key(tenant_id, public_key, name=None, expires_in=None):
    raw_base64 = parse_public_key(public_key)
    locked_tenant(tenant_id)
    now = now_seconds()
    # Under the tenant row's lock: of concurrent registrations of one key, exactly one is made.
    # A second entry would outlive the revocation of the first and keep the key verifying.
    existing = db.session.execute(
        select(SigningKey.id).where(SigningKey.tenant_id == tenant_id,
                                    SigningKey.public_key == raw_base64, *_active(now))
    ).scalar_one_or_none()
    if existing is not None:
        raise Conflict(ALREADY_REGISTERED,
                       details={"public_key": [f"already registered as signing key {existing}"]})
    if _active_count(tenant_id, now) >= MAX_ACTIVE_KEYS:
        raise Conflict(TOO_MANY)
    key = SigningKey(tenant_id=tenant_id, id="sk_" + secrets.token_hex(12), name=name,
                     public_key=raw_base64, created_at=now,
                     expires_at=expiry(expires_in))
    db.session.add(key)
    db.session.flush()
    audit.record(tenant_id, "signing_key.added", key_id=key.id)
    log.info("signing key added", extra={"tenant_id": tenant_id, "signing_key_id": key.id})
    return key


def list_signing_keys(tenant_id):
    """The tenant's signing keys that still verify, oldest first."""
    existing_tenant(tenant_id)
    return db.session.execute(
        select(SigningKey).where(SigningKey.tenant_id == tenant_id, *_active(now_seconds()))
        .order_by(SigningKey.created_at, SigningKey.id)
    ).scalars().all()


def revoke_signing_key(tenant_id, key_id):
    tenant = locked_tenant(tenant_id)
    now = now_seconds()
    key = db.session.execute(
        select(SigningKey).where(SigningKey.tenant_id == tenant_id, SigningKey.id == key_id,
                                 *_active(now))
    ).scalar_one_or_none()
    if key is None:
        raise NotFound("signing key not found")
    if tenant.signature_scheme == "ed25519" and _active_count(tenant_id, now) == 1:
        raise Conflict(LAST_KEY)
    key.revoked_at = now
    db.session.flush()
    audit.record(tenant_id, "signing_key.revoked", key_id=key.id)
    log.info("signing key revoked", extra={"tenant_id": tenant_id, "signing_key_id": key_id})
    return key


def set_signature_scheme(tenant_id, scheme, grace_seconds=0):
    """Switch the tenant's scheme; for `grace_seconds` the previous one still verifies."""
    tenant = locked_tenant(tenant_id)
    now = now_seconds()
    if scheme == "ed25519" and _active_count(tenant_id, now) == 0:
        raise Conflict(NEEDS_A_KEY)
    if scheme != tenant.signature_scheme:
        audit.record(tenant_id, "signature_scheme.changed", old=tenant.signature_scheme,
                     new=scheme, grace_seconds=grace_seconds)
        if grace_seconds > 0:
            tenant.previous_signature_scheme = tenant.signature_scheme
            tenant.previous_scheme_valid_until = now + grace_seconds
        else:
            tenant.previous_signature_scheme = tenant.previous_scheme_valid_until = None
        tenant.signature_scheme = scheme
    elif grace_seconds == 0 and _in_grace(tenant, now):
        # The scheme in force asked for with no grace: the previous one (a weaker scheme, say)
        # stops verifying now, as "0: it stops at once" says.
        audit.record(tenant_id, "signature_scheme.changed", old=scheme, new=scheme,
                     grace_seconds=0, grace_ended=tenant.previous_signature_scheme)
        tenant.previous_signature_scheme = tenant.previous_scheme_valid_until = None
    db.session.flush()
    log.info("signature scheme set", extra={"tenant_id": tenant_id, "scheme": scheme,
                                            "grace_seconds": grace_seconds})
    return tenant


def _in_grace(tenant, now):
    return (tenant.previous_signature_scheme is not None
            and (tenant.previous_scheme_valid_until or 0) >= now)


def scheme_state(tenant):
    """What the signature-scheme endpoints answer: the scheme, and the previous one while it
    still verifies."""
    in_grace = _in_grace(tenant, now_seconds())
    return {"scheme": tenant.signature_scheme,
            "previous_scheme": tenant.previous_signature_scheme if in_grace else None,
            "previous_valid_until": tenant.previous_scheme_valid_until if in_grace else None}
