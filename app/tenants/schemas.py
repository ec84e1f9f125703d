from email_validator import EmailNotValidError, validate_email
from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.schemas import RequestSchema
from app.tenants.plans import PLANS, SIGNATURE_SCHEMES

PLAN_MESSAGE = "plan must be one of: " + ", ".join(PLANS)
SCHEME_MESSAGE = "signature_scheme must be one of: " + ", ".join(SIGNATURE_SCHEMES)


def _valid_email(value):
    try:
        validate_email(value, check_deliverability=False)
    except EmailNotValidError:
        raise ValidationError("email is not a valid email address") from None


class TenantCreateSchema(RequestSchema):
    email = fields.String(
        required=True,
        validate=[validate.Length(max=254, error="email is too long"), _valid_email],
        error_messages={"required": "email is required", "invalid": "email must be a string"},
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


class TenantSchema(Schema):
    tenant_id = fields.Integer(attribute="id")
    email = fields.String()
    plan = fields.String()
    active = fields.Boolean()
    api_key_prefix = fields.String()
    signature_scheme = fields.String()
    created_at = fields.DateTime(format="iso")


class UsageSchema(Schema):
    email = fields.String()
    plan = fields.String()
    usage_count = fields.Integer()
    rate_limit = fields.Integer(allow_none=True)
    remaining = fields.Integer(allow_none=True)


class RotateKeySchema(Schema):
    new_key = fields.String()
    message = fields.String()


tenant_create_schema = TenantCreateSchema()
tenant_update_schema = TenantUpdateSchema()
tenant_schema = TenantSchema()
tenants_schema = TenantSchema(many=True)
usage_schema = UsageSchema()
rotate_key_schema = RotateKeySchema()
