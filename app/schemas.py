"""Base for request schemas: unknown fields are refused and named."""
import re

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from app.errors import UNKNOWN_FIELD

# C0 controls (NUL included), DEL and C1 controls: never part of an identifier or an address.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The same rule for the OpenAPI document (an ECMA 262 pattern).
NO_CONTROL_CHARACTERS_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"


class RequestSchema(Schema):
    class Meta:
        unknown = RAISE

    error_messages = {"unknown": UNKNOWN_FIELD, "type": "request body must be a JSON object"}

    def on_bind_field(self, field_name, field_obj):
        """A null where a field takes none is refused with the field's own text for a wrong
        value, when it has one ("plan must be one of: ..."), not marshmallow's "Field may not be
        null.", which names no field. So is a null inside a list ("scopes": [null])."""
        _null_as_invalid(field_obj)
        if isinstance(field_obj, fields.List):
            _null_as_invalid(field_obj.inner)


def _null_as_invalid(field_obj):
    messages, defaults = field_obj.error_messages, _default_messages(type(field_obj))
    if messages["null"] == defaults["null"] and messages["invalid"] != defaults["invalid"]:
        messages["null"] = messages["invalid"]


def _default_messages(field_class):
    """marshmallow's own error texts for a field class (its and its bases' defaults)."""
    messages = {}
    for cls in reversed(field_class.__mro__):
        messages.update(getattr(cls, "default_error_messages", {}))
    return messages


def no_control_characters(name, refused=CONTROL_CHARACTERS):
    """A validator for string fields that hold no free text (ids, signatures, addresses);
    `refused` may add characters that are as invisible to a reader."""
    message = f"{name} must not contain control characters"

    def check(value):
        if refused.search(value):
            raise ValidationError(message)

    return check


class StrictInteger(fields.Integer):
    """A JSON integer: no strings, floats or booleans (bool is an int subclass in Python)."""

    def __init__(self, **kwargs):
        super().__init__(strict=True, **kwargs)

    def _validated(self, value):
        # type() rather than isinstance: excludes bool, and skips the slow numbers.Integral check.
        if type(value) is not int:
            raise self.make_error("invalid")
        return value


class StrictBoolean(fields.Boolean):
    """JSON true or false only. marshmallow's truthy/falsy sets cannot say this: 0 == False and
    1 == True in Python, so {"active": 0} would deactivate a tenant."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class QueryInteger(fields.Integer):
    """A whole number in the query string: ASCII digits only (no sign, space or other script's
    digits), within [minimum, maximum]; anything else is one clear text naming the parameter."""

    DIGITS = re.compile(r"[0-9]{1,10}")

    def __init__(self, minimum, maximum, **kwargs):
        # The Range validator never fails after _deserialize; it states the bounds in the document.
        super().__init__(validate=validate.Range(minimum, maximum), **kwargs)
        self.minimum, self.maximum = minimum, maximum

    def _deserialize(self, value, attr, data, **kwargs):
        if not (isinstance(value, str) and self.DIGITS.fullmatch(value)
                and self.minimum <= int(value) <= self.maximum):
            raise ValidationError(
                f"{self.name} must be an integer between {self.minimum} and {self.maximum}")
        return int(value)


class Extended:
    """An object with a few more attributes, for a response schema to dump in one piece (a
    tenant with its usage, a new tenant with its credentials). The object is not changed."""

    def __init__(self, obj, **extra):
        self.__dict__.update(extra)
        self._obj = obj

    def __getattr__(self, name):  # only for names not set above
        return getattr(self._obj, name)
