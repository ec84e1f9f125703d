import re
from datetime import timezone

from email_validator import EmailNotValidError, validate_email
from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.schemas import (
    QueryInteger,
    RequestSchema,
    StrictBoolean,
    StrictInteger,
    no_control_characters,
)
from app.sql import MAX_ID
from app.tenants import scopes
from app.tenants.plans import PLANS, SIGNATURE_SCHEMES

class UtcDateTime(fields.DateTime):
    """Stored times are naive UTC; say so on the wire (RFC 3339 needs an offset)."""

    def _serialize(self, value, attr, obj, **kwargs):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return super()._serialize(value, attr, obj, **kwargs)


PLAN_MESSAGE = "plan must be one of: " + ", ".join(PLANS)
SCHEME_MESSAGE = "signature_scheme must be one of: " + ", ".join(SIGNATURE_SCHEMES)


NOT_ASCII_EMAIL = "email must contain ASCII characters only"


def _valid_email(value):
    # The OpenAPI document says `format: email`, whose addresses are ASCII (an internationalized
    # address is `idn-email`, which the service does not take: mail to it needs SMTPUTF8).
    if not value.isascii():
        raise ValidationError(NOT_ASCII_EMAIL)
    try:
        # Syntax only: no DNS lookups at provisioning time; special-use domains (.test) pass.
        validate_email(value, check_deliverability=False, test_environment=True,
                       allow_smtputf8=False)
    except EmailNotValidError:
        raise ValidationError("email is not a valid email address") from None


class TenantCreateSchema(RequestSchema):
    email = fields.String(
        required=True,
        validate=[validate.Length(max=254, error="email is too long"),
                  no_control_characters("email"), _valid_email],
        error_messages={"required": "email is required", "invalid": "email must be a string"},
        # No pattern: the email-validator library's syntax rules decide (no DNS), which no
        # pattern spells (one refused a@b.c, which they take, and took a..b@example.com).
        metadata={"format": "email",
                  "description": "An email address, by the syntax rules of the email-validator "
                                 "library (ASCII only, no DNS lookup)."},
    )
    plan = fields.String(
        load_default="free",
        validate=validate.OneOf(PLANS, error=PLAN_MESSAGE),
        error_messages={"invalid": PLAN_MESSAGE},
    )
    send_email = StrictBoolean(
        load_default=False, error_messages={"invalid": "send_email must be true or false"}
    )


class TenantUpdateSchema(RequestSchema):
    class Meta(RequestSchema.Meta):
        openapi = {"minProperties": 1}  # the rule of _not_empty, for the document

    plan = fields.String(
        validate=validate.OneOf(PLANS, error=PLAN_MESSAGE), error_messages={"invalid": PLAN_MESSAGE}
    )
    active = StrictBoolean(error_messages={"invalid": "active must be true or false"})
    signature_scheme = fields.String(
        validate=validate.OneOf(SIGNATURE_SCHEMES, error=SCHEME_MESSAGE),
        error_messages={"invalid": SCHEME_MESSAGE},
    )

    @validates_schema
    def _not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of plan, active, signature_scheme")


class UsageSchema(Schema):
    email = fields.String(required=True)
    plan = fields.String(required=True, validate=validate.OneOf(PLANS))
    usage_count = fields.Integer(required=True)
    rate_limit = fields.Integer(required=True, allow_none=True,
                                metadata={"description": "Monthly verifications; null is unlimited."})
    remaining = fields.Integer(required=True, allow_none=True)


class TenantSchema(Schema):
    tenant_id = fields.Integer(attribute="id", required=True)
    email = fields.String(required=True)
    plan = fields.String(required=True, validate=validate.OneOf(PLANS))
    active = fields.Boolean(required=True)
    signature_scheme = fields.String(required=True, validate=validate.OneOf(SIGNATURE_SCHEMES))
    created_at = UtcDateTime(format="iso", required=True)
    usage = fields.Nested(UsageSchema, metadata={"description": "On single-tenant answers."})


class TenantCreatedSchema(TenantSchema):
    """What provisioning answers: the tenant with its credentials, shown this once."""

    api_key = fields.String(required=True)
    signing_secret = fields.String(required=True)
    email_sent = fields.Boolean(allow_none=True)
    email_error = fields.String(allow_none=True)


class RotateKeySchema(Schema):
    new_key = fields.String(required=True, metadata={"pattern": "^key_live_[0-9a-f]{48}$"})
    message = fields.String(required=True)


class TenantListQuerySchema(Schema):
    limit = QueryInteger(1, 200, load_default=50)
    starting_after = QueryInteger(0, MAX_ID, load_default=0,
                                  metadata={"description": "List tenants after this id."})


class TenantListSchema(Schema):
    tenants = fields.List(fields.Nested(TenantSchema), required=True)
    has_more = fields.Boolean(required=True)


tenant_create_schema = TenantCreateSchema()
tenant_schema = TenantSchema()
GRACE_MAX = 7 * 86400
GRACE_MESSAGE = f"grace_seconds must be an integer between 0 and {GRACE_MAX}"
EXPIRES_IN_MAX = 10 * 365 * 86400
EXPIRES_IN_MESSAGE = f"expires_in must be an integer between 1 and {EXPIRES_IN_MAX} seconds"
PUBLIC_KEY_MAX = 8192  # characters: a PEM key is about 113


def _grace_field():
    return StrictInteger(load_default=0, validate=validate.Range(0, GRACE_MAX, error=GRACE_MESSAGE),
                         error_messages={"invalid": GRACE_MESSAGE},
                         metadata={"description": "Seconds during which the previous one still "
                                                  "verifies (0: it stops at once)."})


class _KeyName(fields.String):
    """Trimmed, as admin key names are: names are read by people, to tell keys apart (a blank
    one is then empty, and refused)."""

    def _deserialize(self, value, attr, data, **kwargs):
        return super()._deserialize(value, attr, data, **kwargs).strip()


# Control characters, and the invisible ones that make two names look alike or reorder what a
# reader sees: bidi marks and overrides, zero-width characters, line separators, the soft
# hyphen and joiners, the Hangul fillers, the Braille blank and other characters that render
# as nothing.
_NAME_REFUSES = ("\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u034f\\u061c\\u115f\\u1160"
                 "\\u17b4\\u17b5\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064"
                 "\\u2066-\\u2069\\u2800\\u3164\\ufeff\\uffa0\\ufff9-\\ufffb")
# Variation selectors (and Mongolian's free ones) only choose how the character before them is
# drawn: a name may hold them (an emoji's U+FE0F), but they are not a character to read.
_NAME_MARKS = "\\u180b-\\u180d\\u180f\\ufe00-\\ufe0f"
# For the document: none of those, and something besides whitespace and marks (the name is
# trimmed, so a blank one is empty). The same is checked below, with the tag characters
# (U+E0000 to U+E007F, refused: invisible too) and the supplement's variation selectors
# (U+E0100 to U+E01EF), which a pattern cannot name in both Python's and ECMA's syntax.
NAME_PATTERN = f"^[^{_NAME_REFUSES}]*[^{_NAME_REFUSES}{_NAME_MARKS}\\s][^{_NAME_REFUSES}]*$"
_REFUSED_IN_NAME = re.compile(f"[{_NAME_REFUSES}\U000e0000-\U000e007f]")
# What is refused outright is the check above's to name.
_READABLE_IN_NAME = re.compile(f"[^{_NAME_MARKS}\\s\U000e0100-\U000e01ef]")
NAME_UNREADABLE = "name must contain a character to read"


def _readable_name(value):
    """Not marks alone: each only changes how the character before it is drawn."""
    if value and not _READABLE_IN_NAME.search(value):
        raise ValidationError(NAME_UNREADABLE)


def _key_name_field(required):
    """A key's name: to tell keys apart, never a secret."""
    optional = {} if required else {"load_default": None, "allow_none": True}
    return _KeyName(
        required=required, **optional,
        validate=[validate.Length(min=1, max=100, error="name must be 1 to 100 characters"),
                  no_control_characters("name", _REFUSED_IN_NAME), _readable_name],
        error_messages={"required": "name is required", "null": "name is required",
                        "invalid": "name must be a string"},
        metadata={"pattern": NAME_PATTERN},
    )


def _expires_in_field():
    return StrictInteger(load_default=None, allow_none=True,
                         validate=validate.Range(1, EXPIRES_IN_MAX, error=EXPIRES_IN_MESSAGE),
                         error_messages={"invalid": EXPIRES_IN_MESSAGE})


class SigningKeyCreateSchema(RequestSchema):
    public_key = fields.String(
        required=True,
        validate=validate.Length(min=1, max=PUBLIC_KEY_MAX,
                                 error=f"public_key must be 1 to {PUBLIC_KEY_MAX} characters"),
        error_messages={"required": "public_key is required", "null": "public_key is required",
                        "invalid": "public_key must be a string"},
        # No pattern: PEM (SubjectPublicKeyInfo) is taken as well as base64, and a pattern of
        # the base64 form alone made clients that check the document refuse PEM keys.
        metadata={"description": "Ed25519 public key: standard base64 of its 32 raw bytes "
                                 "(44 characters), or PEM (SubjectPublicKeyInfo). Never a "
                                 "private key."},
    )
    name = _key_name_field(required=False)
    expires_in = _expires_in_field()


class SigningKeySchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True, allow_none=True)
    fingerprint = fields.String(
        required=True, metadata={"pattern": "^SHA256:[A-Za-z0-9+/]{43}$",
                                 "description": "SHA256: and the unpadded base64 of the SHA-256 "
                                                "of the key's 32 raw bytes, as OpenSSH writes it."})
    created_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})
    expires_at = fields.Integer(required=True, allow_none=True,
                                metadata={"description": "Unix seconds; null: no expiry."})


class RevokedSigningKeySchema(SigningKeySchema):
    revoked_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})


class SigningKeyListSchema(Schema):
    signing_keys = fields.List(fields.Nested(SigningKeySchema), required=True)


class SignatureSchemeRequestSchema(RequestSchema):
    scheme = fields.String(
        required=True,
        validate=validate.OneOf(SIGNATURE_SCHEMES,
                                error="scheme must be one of: " + ", ".join(SIGNATURE_SCHEMES)),
        error_messages={"required": "scheme is required", "null": "scheme is required",
                        "invalid": "scheme must be a string"},
    )
    grace_seconds = _grace_field()


class SignatureSchemeSchema(Schema):
    scheme = fields.String(required=True, validate=validate.OneOf(SIGNATURE_SCHEMES))
    previous_scheme = fields.String(required=True, allow_none=True)
    previous_valid_until = fields.Integer(required=True, allow_none=True,
                                          metadata={"description": "Unix seconds."})


class SigningSecretRotateSchema(RequestSchema):
    grace_seconds = _grace_field()


class SigningSecretSchema(Schema):
    signing_secret = fields.String(required=True, metadata={"pattern": "^sig_live_[0-9a-f]{64}$"})
    previous_valid_until = fields.Integer(required=True, allow_none=True,
                                          metadata={"description": "Unix seconds."})


SCOPES_MESSAGE = "scopes must be drawn from: " + ", ".join(scopes.SCOPES)


class ApiKeyCreateSchema(RequestSchema):
    name = _key_name_field(required=True)
    expires_in = _expires_in_field()
    scopes = fields.List(
        fields.String(validate=validate.OneOf(scopes.SCOPES, error=SCOPES_MESSAGE),
                      error_messages={"invalid": SCOPES_MESSAGE}),
        load_default=None,
        # Room for each scope named twice (the set is what is kept), no more.
        validate=validate.Length(min=1, max=len(scopes.SCOPES) * 2,
                                 error=f"scopes must list 1 to {len(scopes.SCOPES) * 2} "
                                       "scope names"),
        error_messages={"invalid": "scopes must be a list of scope names"},
        metadata={"description": "What the key may do (default: [\"intents\"]), never more than "
                                 "the key that creates it: " + "; ".join(
                                     f"`{name}`: {what}"
                                     for name, what in scopes.WHAT_EACH_GRANTS.items())},
    )


class _Scopes(fields.List):
    """A key's scopes as a list, from the column's space-separated form."""

    def __init__(self, **kwargs):
        super().__init__(fields.String(validate=validate.OneOf(scopes.SCOPES)), **kwargs)

    def _serialize(self, value, attr, obj, **kwargs):
        return super()._serialize(scopes.listed(value), attr, obj, **kwargs)


class ApiKeySchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    prefix = fields.String(required=True, metadata={"description": "The key's first characters."})
    scopes = _Scopes(required=True, metadata={"description": "What the key may do."})
    created_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})
    expires_at = fields.Integer(required=True, allow_none=True,
                                metadata={"description": "Unix seconds; null: no expiry."})


class RevokedApiKeySchema(ApiKeySchema):
    revoked_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})


class ApiKeyCreatedSchema(ApiKeySchema):
    api_key = fields.String(required=True, metadata={
        "pattern": "^key_live_[0-9a-f]{48}$", "description": "Shown this once."})


class ApiKeyListSchema(Schema):
    keys = fields.List(fields.Nested(ApiKeySchema), required=True)


class AuditEntrySchema(Schema):
    id = fields.Integer(required=True, metadata={"description": "Per tenant; the `before` cursor."})
    at = fields.Integer(required=True, metadata={"description": "Unix seconds."})
    action = fields.String(required=True)
    actor = fields.String(required=True, metadata={
        "description": "key:<prefix>, admin:<admin key name>, or cli."})
    request_id = fields.String(required=True, allow_none=True)
    address = fields.String(required=True, allow_none=True)
    details = fields.Dict(required=True, metadata={"description": "Ids, prefixes, plans: never "
                                                                  "a secret."})


class AuditLogSchema(Schema):
    entries = fields.List(fields.Nested(AuditEntrySchema), required=True)


class UsageDaySchema(Schema):
    date = fields.String(required=True, metadata={"format": "date"})
    verifications = fields.Integer(required=True)
    cleared = fields.Integer(required=True)
    blocked = fields.Dict(keys=fields.String(), values=fields.Integer(), required=True)


class DailyUsageSchema(Schema):
    days = fields.List(fields.Nested(UsageDaySchema), required=True)


AUDIT_CURSOR_MAX = 2**31 - 1


class AuditLogQuerySchema(Schema):
    limit = QueryInteger(1, 200, load_default=50)
    before = QueryInteger(1, AUDIT_CURSOR_MAX, load_default=None,
                          metadata={"description": "The last id of the previous page."})


class DailyUsageQuerySchema(Schema):
    days = QueryInteger(1, 92, load_default=30, metadata={"description": "UTC days, today "
                                                                        "included."})


# Instances the CLI loads and dumps with (the views name the classes in their decorators).
signing_key_create_schema = SigningKeyCreateSchema()
signing_key_schema = SigningKeySchema()
signature_scheme_schema = SignatureSchemeSchema()
api_key_create_schema = ApiKeyCreateSchema()
