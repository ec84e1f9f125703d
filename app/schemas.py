"""Base for request schemas: unknown fields are refused and named."""
from marshmallow import RAISE, Schema

from app.errors import UNKNOWN_FIELD


class RequestSchema(Schema):
    class Meta:
        unknown = RAISE

    error_messages = {"unknown": UNKNOWN_FIELD, "type": "request body must be a JSON object"}
