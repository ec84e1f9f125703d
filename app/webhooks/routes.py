"""Webhook endpoints and usage alerts, one view per operation on the tenant and admin paths
(app.tenants.self_service_routes.operation; who may call is app.auth.for_tenant's)."""
from app.auth import for_tenant
from app.openapi import Blueprint
from app.schemas import Extended
from app.sql import unit_of_work
from app.tenants import scopes
from app.tenants.self_service_routes import TENANT_NOT_FOUND, operation
from app.traffic import limits
from app.webhooks import service
from app.webhooks.schemas import (
    DeliveryListSchema,
    DeliveryQuerySchema,
    UsageAlertsSchema,
    WebhookCreatedSchema,
    WebhookCreateSchema,
    WebhookListSchema,
    WebhookRotateSchema,
    WebhookSchema,
    WebhookSecretSchema,
    WebhookTestSchema,
)

bp = Blueprint("webhooks", __name__, url_prefix="/v1",
               description="Webhook endpoints (Standard Webhooks) and usage alerts: under "
                           "/v1/tenant for the calling tenant's key, under "
                           "/v1/admin/tenants/{tenant_id} for an admin key.")
limits.declare(bp)

WEBHOOK_NOT_FOUND = TENANT_NOT_FOUND + f" Or `{service.NOT_FOUND}`."


@operation("POST", "/webhooks", bp)
@bp.response(201, WebhookCreatedSchema)
@bp.error(404, TENANT_NOT_FOUND)
@bp.error(409, f"`{service.TOO_MANY}`.")
@for_tenant(scopes.WEBHOOKS_WRITE)
@bp.arguments(WebhookCreateSchema)
def create_webhook(fields, tenant_id):
    """Register an endpoint (https:// to a public address); its secret is shown this once"""
    with unit_of_work():
        row, secret = service.create_endpoint(tenant_id, fields["url"], fields["events"])
    return Extended(row, secret=secret)


@operation("GET", "/webhooks", bp)
@bp.response(200, WebhookListSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
def list_webhooks(tenant_id):
    """The tenant's endpoints (never a secret)"""
    return {"webhooks": service.list_endpoints(tenant_id)}


@operation("DELETE", "/webhooks/<webhook_id>", bp)
@bp.response(200, WebhookSchema)
@bp.error(404, WEBHOOK_NOT_FOUND)
@for_tenant(scopes.WEBHOOKS_WRITE)
def delete_webhook(tenant_id, webhook_id):
    """Delete an endpoint and its delivery history; nothing more is sent to it"""
    with unit_of_work():
        return service.delete_endpoint(tenant_id, webhook_id)


@operation("POST", "/webhooks/<webhook_id>/rotate-secret", bp)
@bp.response(200, WebhookSecretSchema)
@bp.error(404, WEBHOOK_NOT_FOUND)
@for_tenant(scopes.WEBHOOKS_WRITE)
@bp.arguments(WebhookRotateSchema, required=False)
def rotate_webhook_secret(fields, tenant_id, webhook_id):
    """A new secret, shown this once; during the grace both sign each attempt"""
    with unit_of_work():
        secret, valid_until = service.rotate_secret(tenant_id, webhook_id, **fields)
    return {"id": webhook_id, "secret": secret, "previous_valid_until": valid_until}


@operation("POST", "/webhooks/<webhook_id>/test", bp)
@bp.response(202, WebhookTestSchema)
@bp.error(404, WEBHOOK_NOT_FOUND)
@for_tenant(scopes.WEBHOOKS_WRITE)
def test_webhook(tenant_id, webhook_id):
    """Queue a webhook.test event for this endpoint"""
    with unit_of_work():
        return service.send_test(tenant_id, webhook_id)


@operation("GET", "/webhooks/<webhook_id>/deliveries", bp)
@bp.response(200, DeliveryListSchema)
@bp.error(404, WEBHOOK_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
@bp.arguments(DeliveryQuerySchema, location="query")
def list_deliveries(query, tenant_id, webhook_id):
    """Each attempt, made or scheduled, newest first"""
    return {"deliveries": service.deliveries(tenant_id, webhook_id, query["limit"],
                                             query["before"])}


@operation("GET", "/usage-alerts", bp)
@bp.response(200, UsageAlertsSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.USAGE_READ)
def get_usage_alerts(tenant_id):
    """The percentages of the plan at which usage.threshold is sent"""
    return service.usage_alerts(tenant_id)


@operation("PUT", "/usage-alerts", bp)
@bp.response(200, UsageAlertsSchema)
@bp.error(404, TENANT_NOT_FOUND)
@for_tenant(scopes.WEBHOOKS_WRITE)
@bp.arguments(UsageAlertsSchema)
def set_usage_alerts(fields, tenant_id):
    """Set 1 to 5 thresholds, each 1..100 per cent of the plan"""
    with unit_of_work():
        return service.set_usage_alerts(tenant_id, fields["thresholds"])
