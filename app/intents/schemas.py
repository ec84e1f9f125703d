import re

from intentgate.signing import MAX_SAFE_INTEGER
from marshmallow import Schema, ValidationError, fields, validate

from app.context_store.taxonomy import INTENT_CLASSES
from app.intents.reasons import BLOCK_REASONS
from app.schemas import (
    NO_CONTROL_CHARACTERS_PATTERN,
    RequestSchema,
    StrictInteger,
    no_control_characters,
)

TOKEN_CHARACTERS = re.compile(r"[A-Za-z0-9\-_.=+/~]+")
TOKEN_MIN, TOKEN_MAX = 10, 4096
TTL_MIN, TTL_MAX, TTL_DEFAULT = 1, 86400, 3600
TTL_MESSAGE = f"ttl must be between {TTL_MIN} and {TTL_MAX} seconds"


# The fields of generate and verify check their values themselves, in _deserialize, rather
# than in marshmallow's @validates and @post_load hooks: the same texts, without the hooks'
# machinery, which cost more than the checks (about 10 K instructions a hook, 1 % of a request:
# bench/instructions.py).


class UserToken(fields.String):
    """The user's JWT as generate takes it: 10 to 4096 characters of the token alphabet."""

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if len(value) < TOKEN_MIN:
            raise ValidationError("token too short")
        if len(value) > TOKEN_MAX:
            raise ValidationError("token too long")
        if not TOKEN_CHARACTERS.fullmatch(value):
            raise ValidationError("token contains invalid characters")
        return value


class Ttl(StrictInteger):
    """An intent's validity in whole seconds, TTL_MIN to TTL_MAX."""

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if not TTL_MIN <= value <= TTL_MAX:
            raise ValidationError(TTL_MESSAGE)
        return value


class GenerateSchema(RequestSchema):
    user_token = UserToken(
        required=True,
        error_messages={"required": "user_token is required", "null": "user_token is required",
                        "invalid": "user_token must be a string"},
        metadata={"minLength": TOKEN_MIN, "maxLength": TOKEN_MAX,
                  "pattern": "^[A-Za-z0-9\\-_.=+/~]+$",
                  "description": "The user's JWT. Sent to the context store; never stored."},
    )
    ttl = Ttl(
        load_default=TTL_DEFAULT,
        metadata={"minimum": TTL_MIN, "maximum": TTL_MAX, "description": "Seconds of validity."},
        error_messages={"invalid": "ttl must be an integer"},
    )


class IntentSignatureSchema(Schema):
    intent_hash = fields.String(required=True, metadata={"pattern": "^sha256:[0-9a-f]{64}$"})
    intent_class = fields.String(required=True, validate=validate.OneOf(INTENT_CLASSES))
    expires_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})


# What a payload value may be, for the OpenAPI document (component "PayloadValue"): any JSON,
# with numbers inside the range whose canonical form is exact (larger integers are 400).
PAYLOAD_VALUE = {
    "description": "Any JSON value. Integers must be within ±(2^53-1): send larger values as "
                   "strings. At most 64 levels of nesting in the whole body.",
    "nullable": True,
    "anyOf": [
        {"type": "string"},
        {"type": "boolean"},
        {"type": "number", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER},
        {"type": "array", "items": {"$ref": "#/components/schemas/PayloadValue"}},
        {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/PayloadValue"}},
    ],
}

HASH_PREFIX = "sha256:"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class IntentHash(fields.String):
    """An intent signature as verify names it: "sha256:" and 64 hex digits in either case,
    loaded in lower case, as generate issues it."""

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if not value.startswith(HASH_PREFIX):
            raise ValidationError("intent hash must start with 'sha256:'")
        if not _HEX64.fullmatch(value[len(HASH_PREFIX):]):
            raise ValidationError("intent hash has invalid length")
        return value.lower()


def _required(name):
    return {"required": f"{name} is required", "null": f"{name} is required"}


class ScaleResponseSchema(RequestSchema):
    """The AI service's response, as sent inside verify."""

    match_id = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=256,
                                  error="response.match_id must be 1 to 256 characters"),
                  no_control_characters("response.match_id")],
        error_messages={**_required("response.match_id"),
                        "invalid": "response.match_id must be a string"},
        metadata={"pattern": NO_CONTROL_CHARACTERS_PATTERN},
    )
    payload = fields.Dict(
        required=True,
        metadata={"additionalProperties": {"$ref": "#/components/schemas/PayloadValue"}},
        error_messages={**_required("response.payload"),
                        "invalid": "response.payload must be a JSON object"},
    )
    timestamp = StrictInteger(
        required=True,
        # Bounded like payload integers, so the whole body has one exact canonical form (the
        # Idempotency-Key digest) and the signed message spells exactly this number.
        validate=validate.Range(min=-MAX_SAFE_INTEGER, max=MAX_SAFE_INTEGER,
                                error="response.timestamp must be Unix seconds within ±(2^53-1)"),
        error_messages={**_required("response.timestamp"),
                        "invalid": "response.timestamp must be an integer (Unix seconds)"},
    )
    signature = fields.String(
        required=True,
        validate=no_control_characters("response.signature"),
        error_messages={**_required("response.signature"),
                        "invalid": "response.signature must be a string"},
        metadata={"pattern": NO_CONTROL_CHARACTERS_PATTERN},
    )

    error_messages = {**RequestSchema.error_messages, "type": "response must be a JSON object"}


class VerifySchema(RequestSchema):
    original_intent_hash = IntentHash(
        required=True,
        metadata={"pattern": "^sha256:[0-9a-fA-F]{64}$"},
        error_messages={**_required("original_intent_hash"),
                        "invalid": "original_intent_hash must be a string"},
    )
    response = fields.Nested(
        ScaleResponseSchema, required=True,
        error_messages={**_required("response"), "type": "response must be a JSON object"},
    )


class VerificationResultSchema(Schema):
    cleared = fields.Boolean(required=True)
    reason = fields.String(required=True, allow_none=True,
                           validate=validate.OneOf(BLOCK_REASONS),
                           metadata={"description": "Why the response was blocked; null when cleared."})
    payload = fields.Dict(required=True, allow_none=True,
                          metadata={"description": "The verified AI payload; null when blocked."})
