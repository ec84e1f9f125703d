import re

from marshmallow import Schema, ValidationError, fields, validates

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
        if isinstance(value, bool):
            raise self.make_error("invalid")
        return super()._validated(value)


class GenerateSchema(RequestSchema):
    user_token = fields.Raw(required=True, error_messages={"required": "user_token is required",
                                                           "null": "user_token is required"})
    ttl = StrictInteger(
        load_default=TTL_DEFAULT,
        error_messages={"invalid": "ttl must be an integer", "null": "ttl must be an integer"},
    )

    @validates("user_token")
    def _check_token(self, value, **kwargs):
        if not isinstance(value, str):
            raise ValidationError("user_token must be a string")
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
    intent_hash = fields.String()
    intent_class = fields.String()
    expires_at = fields.Integer()


generate_schema = GenerateSchema()
intent_signature_schema = IntentSignatureSchema()
