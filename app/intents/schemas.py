import re

from marshmallow import Schema, ValidationError, fields, post_load, validate, validates

from app.context_store.taxonomy import INTENT_CLASSES
from app.intents.reasons import BLOCK_REASONS
from app.schemas import RequestSchema

TOKEN_CHARACTERS = re.compile(r"[A-Za-z0-9\-_.=+/~]+")
TOKEN_MIN, TOKEN_MAX = 10, 4096
TTL_MIN, TTL_MAX, TTL_DEFAULT = 1, 86400, 3600
TTL_MESSAGE = f"ttl must be between {TTL_MIN} and {TTL_MAX} seconds"


class StrictInteger(fields.Integer):
    """A JSON integer: no strings, floats or booleans (bool is an int subclass in Python)."""

    def __init__(self, **kwargs):
        super().__init__(strict=True, **kwargs)

    def _validated(self, value):
        # type() rather than isinstance: excludes bool, and skips the slow numbers.Integral check.
        if type(value) is not int:
            raise self.make_error("invalid")
        return value


class GenerateSchema(RequestSchema):
    user_token = fields.String(
        required=True,
        error_messages={"required": "user_token is required", "null": "user_token is required",
                        "invalid": "user_token must be a string"},
        metadata={"minLength": TOKEN_MIN, "maxLength": TOKEN_MAX,
                  "pattern": "^[A-Za-z0-9\\-_.=+/~]+$",
                  "description": "The user's JWT. Sent to the context store; never stored."},
    )
    ttl = StrictInteger(
        load_default=TTL_DEFAULT,
        metadata={"minimum": TTL_MIN, "maximum": TTL_MAX, "description": "Seconds of validity."},
        error_messages={"invalid": "ttl must be an integer", "null": "ttl must be an integer"},
    )

    @validates("user_token")
    def _check_token(self, value, **kwargs):
        if len(value) < TOKEN_MIN:
            raise ValidationError("token too short")
        if len(value) > TOKEN_MAX:
            raise ValidationError("token too long")
        if not TOKEN_CHARACTERS.fullmatch(value):
            raise ValidationError("token contains invalid characters")

    @validates("ttl")
    def _check_ttl(self, value, **kwargs):
        if not TTL_MIN <= value <= TTL_MAX:
            raise ValidationError(TTL_MESSAGE)


class IntentSignatureSchema(Schema):
    intent_hash = fields.String(required=True, metadata={"pattern": "^sha256:[0-9a-f]{64}$"})
    intent_class = fields.String(required=True, validate=validate.OneOf(INTENT_CLASSES))
    expires_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})


generate_schema = GenerateSchema()
intent_signature_schema = IntentSignatureSchema()


HASH_PREFIX = "sha256:"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def _required(name):
    return {"required": f"{name} is required", "null": f"{name} is required"}


class ScaleResponseSchema(RequestSchema):
    """The AI service's response, as sent inside verify."""

    match_id = fields.String(
        required=True,
        validate=validate.Length(min=1, max=256,
                                 error="response.match_id must be 1 to 256 characters"),
        error_messages={**_required("response.match_id"),
                        "invalid": "response.match_id must be a string"},
    )
    payload = fields.Dict(
        required=True,
        error_messages={**_required("response.payload"),
                        "invalid": "response.payload must be a JSON object"},
    )
    timestamp = StrictInteger(
        required=True,
        error_messages={**_required("response.timestamp"),
                        "invalid": "response.timestamp must be an integer (Unix seconds)"},
    )
    signature = fields.String(
        required=True,
        error_messages={**_required("response.signature"),
                        "invalid": "response.signature must be a string"},
    )

    error_messages = {**RequestSchema.error_messages, "type": "response must be a JSON object"}


class VerifySchema(RequestSchema):
    original_intent_hash = fields.String(
        required=True,
        metadata={"pattern": "^sha256:[0-9a-fA-F]{64}$"},
        error_messages={**_required("original_intent_hash"),
                        "invalid": "original_intent_hash must be a string"},
    )
    response = fields.Nested(
        ScaleResponseSchema, required=True,
        error_messages={**_required("response"), "type": "response must be a JSON object"},
    )

    @validates("original_intent_hash")
    def _check_hash(self, value, **kwargs):
        if not value.startswith(HASH_PREFIX):
            raise ValidationError("intent hash must start with 'sha256:'")
        if not _HEX64.fullmatch(value[len(HASH_PREFIX):]):
            raise ValidationError("intent hash has invalid length")

    @post_load
    def _normalize_hash(self, data, **kwargs):
        data["original_intent_hash"] = data["original_intent_hash"].lower()
        return data


class VerificationResultSchema(Schema):
    cleared = fields.Boolean(required=True)
    reason = fields.String(required=True, allow_none=True,
                           validate=validate.OneOf(BLOCK_REASONS),
                           metadata={"description": "Why the response was blocked; null when cleared."})
    payload = fields.Dict(required=True, allow_none=True,
                          metadata={"description": "The verified AI payload; null when blocked."})


verify_schema = VerifySchema()
verification_result_schema = VerificationResultSchema()
