"""What the webhook endpoints take and answer (CONTRACT.md, Webhooks)."""
from marshmallow import Schema, ValidationError, fields, validate

from app.schemas import QueryInteger, RequestSchema, StrictInteger, no_control_characters
from app.tenants.schemas import _grace_field
from app.webhooks.events import AUDIT_ACTIONS, AUDIT_PREFIX, SUBSCRIBABLE

MAX_THRESHOLDS = 5
EVENTS_MESSAGE = ("events must name event types: " + ", ".join(SUBSCRIBABLE)
                  + ", or audit.<action>")
THRESHOLD_MESSAGE = "thresholds must be integers between 1 and 100"
THRESHOLDS_MESSAGE = f"thresholds must hold 1 to {MAX_THRESHOLDS} integers between 1 and 100"


def _event_type(value):
    audit_action = value.startswith(AUDIT_PREFIX) and value[len(AUDIT_PREFIX):] in AUDIT_ACTIONS
    if value not in SUBSCRIBABLE and not audit_action:
        raise ValidationError(EVENTS_MESSAGE)


class WebhookCreateSchema(RequestSchema):
    url = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=2048, error="url must be 1 to 2048 characters"),
                  no_control_characters("url")],
        error_messages={"required": "url is required", "null": "url is required",
                        "invalid": "url must be a string"},
        metadata={"format": "uri", "pattern": "^https?://",
                  "description": "https:// to a public address (checked again at each "
                                 "connection); http:// and private addresses only where the "
                                 "deployment allows them (development)."},
    )
    events = fields.List(
        fields.String(validate=[validate.Length(max=64, error=EVENTS_MESSAGE), _event_type],
                      error_messages={"invalid": EVENTS_MESSAGE},
                      # For the document: exactly what _event_type takes.
                      metadata={"enum": [*SUBSCRIBABLE,
                                         *(AUDIT_PREFIX + action for action in AUDIT_ACTIONS)]}),
        load_default=None,
        validate=validate.Length(min=1, max=20, error="events must name 1 to 20 event types"),
        error_messages={"invalid": EVENTS_MESSAGE},
        metadata={"description": "Default: every event (" + ", ".join(SUBSCRIBABLE) + "); "
                                 f"`{AUDIT_PREFIX}*` is every audit-log entry. webhook.test "
                                 "always reaches the endpoint it is sent to."},
    )


class _Events(fields.List):
    """The stored space-separated form, as a list."""

    def __init__(self, **kwargs):
        super().__init__(fields.String(), **kwargs)

    def _serialize(self, value, attr, obj, **kwargs):
        return super()._serialize(value.split() if isinstance(value, str) else value,
                                  attr, obj, **kwargs)


class WebhookSchema(Schema):
    id = fields.String(required=True)
    url = fields.String(required=True)
    events = _Events(required=True)
    created_at = fields.Integer(required=True, metadata={"description": "Unix seconds."})


class WebhookCreatedSchema(WebhookSchema):
    secret = fields.String(required=True, metadata={
        "pattern": "^whsec_[A-Za-z0-9+/=]{32,44}$",
        "description": "Shown this once: verifies the webhook-signature header."})


class WebhookListSchema(Schema):
    webhooks = fields.List(fields.Nested(WebhookSchema), required=True)


class WebhookRotateSchema(RequestSchema):
    grace_seconds = _grace_field()


class WebhookSecretSchema(Schema):
    id = fields.String(required=True)
    secret = fields.String(required=True, metadata={"description": "Shown this once."})
    previous_valid_until = fields.Integer(required=True, allow_none=True, metadata={
        "description": "Unix seconds until which the previous secret signs too."})


class WebhookTestSchema(Schema):
    event_id = fields.String(required=True, metadata={"description": "The webhook-id."})
    type = fields.String(required=True)


class DeliverySchema(Schema):
    id = fields.String(required=True)
    event_id = fields.String(required=True)
    type = fields.String(required=True)
    attempt = fields.Integer(required=True)
    at = fields.Integer(required=True, allow_none=True,
                        metadata={"description": "When it was made; null: not yet."})
    status_code = fields.Integer(required=True, allow_none=True)
    error = fields.String(required=True, allow_none=True)
    next_attempt_at = fields.Integer(required=True, allow_none=True)
    delivered = fields.Boolean(required=True)
    state = fields.String(required=True, validate=validate.OneOf(
        ("pending", "delivered", "retried", "failed")))


class DeliveryListSchema(Schema):
    deliveries = fields.List(fields.Nested(DeliverySchema), required=True)


class DeliveryQuerySchema(Schema):
    limit = QueryInteger(1, 200, load_default=50)
    before = fields.String(
        load_default=None,
        validate=validate.Regexp(r"^whd_[0-9a-f]{1,44}\Z", error="before must be a delivery id"),
        metadata={"pattern": "^whd_[0-9a-f]{1,44}$",
                  "description": "The last id of the previous page."})


class UsageAlertsSchema(RequestSchema):
    thresholds = fields.List(
        StrictInteger(validate=validate.Range(1, 100, error=THRESHOLD_MESSAGE),
                      error_messages={"invalid": THRESHOLD_MESSAGE}),
        required=True,
        validate=validate.Length(min=1, max=MAX_THRESHOLDS, error=THRESHOLDS_MESSAGE),
        error_messages={"required": "thresholds is required", "null": THRESHOLDS_MESSAGE,
                        "invalid": THRESHOLDS_MESSAGE},
        metadata={"description": "Percentages of the monthly plan at which usage.threshold is "
                                 "sent, once each a month."},
    )


webhook_create_schema = WebhookCreateSchema()
webhook_schema = WebhookSchema()
webhook_created_schema = WebhookCreatedSchema()
webhook_secret_schema = WebhookSecretSchema()
delivery_schema = DeliverySchema()
usage_alerts_schema = UsageAlertsSchema()
