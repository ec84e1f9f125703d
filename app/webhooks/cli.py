"""flask webhooks ...: the delivery worker, and a tenant's endpoints and usage alerts for an
operator, through the same service as the HTTP API."""
import signal
from functools import wraps

import click

from app import logs
from app.cli_support import CommandGroup, echo_json, one_line_errors
from app.clock import now_seconds
from app.sql import unit_of_work
from app.tenants.cli import TENANT, TENANT_HELP
from app.tenants.schemas import GRACE_MAX
from app.tenants.service import find_tenant
from app.webhooks import delivery, service
from app.webhooks.schemas import (
    delivery_schema,
    usage_alerts_schema,
    webhook_create_schema,
    webhook_schema,
)

# Not an OperatorGroup: the worker's log lines are its record of every attempt.
webhooks = CommandGroup("webhooks", help="Deliver webhooks, and manage a tenant's webhook "
                                         "endpoints and usage alerts. " + TENANT_HELP)
WEBHOOK_ID = click.argument("webhook_id")


def operator_command(name):
    """A command a person runs: one-line errors, routine log lines off the terminal."""

    def decorator(command):
        @wraps(command)
        def quiet(*args, **kwargs):
            with logs.only_failures():
                return command(*args, **kwargs)

        return webhooks.command(name, epilog=TENANT_HELP)(one_line_errors(quiet))

    return decorator


@webhooks.command("deliver")
@click.option("--once", is_flag=True, help="Raise the key-expiry notices due and make the "
                                           "attempts due now, then exit (for a timer).")
def deliver(once):
    """Run the delivery worker (as many as you like, on any hosts). SIGTERM or Ctrl-C: the
    attempt in flight is finished, then the worker exits."""
    from flask import current_app

    if once:  # one pass of what the worker's loop does
        delivery.raise_expiring_keys(now_seconds())
        click.echo(f"{delivery.deliver_due(current_app.config)} attempts made")
        return
    stopping = delivery.StopRequest()

    def stop(_signal, _frame):
        stopping.request()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    delivery.run(stopping)


@operator_command("create")
@TENANT
@click.argument("url")
@click.option("--event", "events_", multiple=True,
              help="An event type to receive (repeat it); default: every event.")
def create(tenant, url, events_):
    """Register a webhook endpoint; its secret is printed once."""
    fields = webhook_create_schema.load({"url": url, "events": list(events_) or None})
    with unit_of_work():
        row, secret = service.create_endpoint(find_tenant(tenant).id, fields["url"],
                                              fields["events"])
    echo_json({**webhook_schema.dump(row), "secret": secret})


@operator_command("list")
@TENANT
def list_(tenant):
    """List a tenant's webhook endpoints."""
    echo_json([webhook_schema.dump(row) for row in
               service.list_endpoints(find_tenant(tenant).id)])


@operator_command("delete")
@TENANT
@WEBHOOK_ID
def delete(tenant, webhook_id):
    """Delete a webhook endpoint and its delivery history."""
    with unit_of_work():
        service.delete_endpoint(find_tenant(tenant).id, webhook_id)
    click.echo(f"webhook {webhook_id} deleted")


@operator_command("rotate-secret")
@TENANT
@WEBHOOK_ID
@click.option("--grace", type=click.IntRange(0, GRACE_MAX), default=0, show_default=True,
              help="Seconds during which the previous secret signs too.")
def rotate_secret(tenant, webhook_id, grace):
    """Issue a new endpoint secret (printed once)."""
    with unit_of_work():
        secret, _ = service.rotate_secret(find_tenant(tenant).id, webhook_id, grace)
    click.echo(secret)


@operator_command("test")
@TENANT
@WEBHOOK_ID
def test(tenant, webhook_id):
    """Queue a webhook.test event for an endpoint."""
    with unit_of_work():
        echo_json(service.send_test(find_tenant(tenant).id, webhook_id))


@operator_command("deliveries")
@TENANT
@WEBHOOK_ID
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
def deliveries(tenant, webhook_id, limit):
    """An endpoint's attempts, newest first."""
    echo_json([delivery_schema.dump(row) for row in
               service.deliveries(find_tenant(tenant).id, webhook_id, limit)])


@operator_command("usage-alerts")
@TENANT
@click.argument("thresholds", nargs=-1, type=int)
def usage_alerts(tenant, thresholds):
    """Show a tenant's usage alert thresholds, or set them (1 to 5 percentages)."""
    tenant_id = find_tenant(tenant).id
    if not thresholds:
        echo_json(service.usage_alerts(tenant_id))
        return
    fields = usage_alerts_schema.load({"thresholds": list(thresholds)})
    with unit_of_work():
        echo_json(service.set_usage_alerts(tenant_id, fields["thresholds"]))
