from datetime import timezone

from email_validator import EmailNotValidError, validate_email
from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.schemas import RequestSchema
from app.tenants.plans import PLANS, SIGNATURE_SCHEMES

class UtcDateTime(fields.DateTime):
    """Stored times are naive UTC; say so on the wire (RFC 3339 needs an offset)."""

    def _serialize(self, value, attr, obj, **kwargs):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return super()._serialize(value, attr, obj, **kwargs)


PLAN_MESSAGE = "plan must be one of: " + ", ".join(PLANS)
SCHEME_MESSAGE = "signature_scheme must be one of: " + ", ".join(SIGNATURE_SCHEMES)


def _valid_email(value):
    try:
        # Syntax only: no DNS lookups at provisioning time; special-use domains (.test) pass.
        validate_email(value, check_deliverability=False, test_environment=True)
    except EmailNotValidError:
        raise ValidationError("email is not a valid email address") from None


class TenantCreateSchema(RequestSchema):
    email = fields.String(
        required=True,
        validate=[validate.Length(max=254, error="email is too long"), _valid_email],
        error_messages={"required": "email is required", "invalid": "email must be a string"},
        metadata={"format": "email", "pattern": "^[^@\\s]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}$"},
    )
    plan = fields.String(
        load_default="free",
        validate=validate.OneOf(PLANS, error=PLAN_MESSAGE),
        error_messages={"invalid": PLAN_MESSAGE},
    )
    send_email = fields.Boolean(
        load_default=False,
        truthy={True}, falsy={False},
        error_messages={"invalid": "send_email must be true or false"},
    )


class TenantUpdateSchema(RequestSchema):
    plan = fields.String(
        validate=validate.OneOf(PLANS, error=PLAN_MESSAGE), error_messages={"invalid": PLAN_MESSAGE}
    )
    active = fields.Boolean(
        truthy={True}, falsy={False}, error_messages={"invalid": "active must be true or false"}
    )
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
    api_key_prefix = fields.String(required=True)
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


tenant_create_schema = TenantCreateSchema()
tenant_update_schema = TenantUpdateSchema()
tenant_schema = TenantSchema()
tenants_schema = TenantSchema(many=True)
usage_schema = UsageSchema()
rotate_key_schema = RotateKeySchema()
