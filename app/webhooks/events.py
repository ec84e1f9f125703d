"""Raising events: an outbox row in the transaction of the change that raised it (CONTRACT.md,
Webhooks). The delivery worker (app.webhooks.delivery) takes them from there.

`usage.threshold` is raised inside the gate's own statement: the monthly count moves by exactly
one per counted verification, so the one verification whose new usage_count equals
ceil(plan_limit * threshold / 100) is the one that crosses the threshold, however many race.
The event's dedupe key (threshold and month) keeps it single even if a plan change would
cross the same threshold again."""
import json
import secrets
import threading
import time
from datetime import datetime, timezone

from sqlalchemy import BigInteger, String, Text, bindparam, cast, exists, literal, select

from app import database
from app.extensions import db
from app.webhooks.models import UsageAlert, WebhookEndpoint, WebhookEvent

USAGE_THRESHOLD = "usage.threshold"
API_KEY_EXPIRING = "api_key.expiring"
TEST = "webhook.test"
AUDIT_PREFIX = "audit."
AUDIT_ANY = "audit.*"
# What an endpoint may subscribe to; "audit.*" is every audit-log entry, "audit.<action>" one.
SUBSCRIBABLE = (USAGE_THRESHOLD, API_KEY_EXPIRING, AUDIT_ANY)
# Every action the audit log records (app.tenants.audit.record refuses any other), so that a
# subscription to a misspelt one ("audit.key.created") is refused, not left silent forever.
AUDIT_ACTIONS = (
    "tenant.created", "tenant.activated", "tenant.deactivated", "plan.changed",
    "api_key.created", "api_key.revoked", "api_key.rotated",
    "signing_secret.rotated", "signing_key.added", "signing_key.revoked",
    "signature_scheme.changed", "usage_alerts.changed",
    "webhook.created", "webhook.deleted", "webhook.secret_rotated",
)
DEFAULT_THRESHOLDS = (80, 100)

# A step back of the clock up to this many microseconds is absorbed: ids go on rising through
# it. A longer one is a wrong clock put right, and ids follow the corrected clock.
ABSORBED_STEP = 1_000_000
_stamp_lock = threading.Lock()
_last_stamp = 0


def _stamp():
    """Microseconds since the epoch, rising at every call in this process: a host's clock can
    be stepped back a little (a time sync, a VM's resume), and ids made one after another must
    still sort in that order, as attempts are claimed by them."""
    global _last_stamp
    with _stamp_lock:
        stamp = time.time_ns() // 1000
        if _last_stamp - ABSORBED_STEP < stamp <= _last_stamp:
            stamp = _last_stamp + 1
        _last_stamp = stamp
        return stamp


def new_id(prefix, stamp=None):
    """A unique id that sorts by creation time (microseconds, then 48 random bits)."""
    return f"{prefix}{_stamp() if stamp is None else stamp:014x}{secrets.token_hex(6)}"


def new_event_id():
    return new_id("msg_")


def receives(subscribed, event_type):
    """Does an endpoint subscribed to `subscribed` (a list) receive `event_type`?"""
    if event_type in subscribed:
        return True
    return event_type.startswith(AUDIT_PREFIX) and AUDIT_ANY in subscribed


def _has_endpoint(tenant_id):
    return db.session.execute(
        select(exists().where(WebhookEndpoint.tenant_id == tenant_id))).scalar()


def raise_event(tenant_id, event_type, data, now, dedupe_key=None, endpoint_id=None,
                only_if_subscribed=True):
    """Add an event to the caller's transaction (the ORM session). With a `dedupe_key`, an
    event already raised under it is not raised again. Tenants without an endpoint raise
    nothing: there is no one to tell, and the outbox stays small."""
    if only_if_subscribed and not _has_endpoint(tenant_id):
        return None
    stamp = _stamp()
    event_id = new_id("msg_", stamp)
    # Never before the id's own second: attempts are claimed by when their events were raised,
    # then by id, and the two must agree when the clock was stepped back between two events.
    created_at = max(now, stamp // 1_000_000)
    statement = database.current().insert(WebhookEvent.__table__).values(
        tenant_id=tenant_id, id=event_id, type=event_type,
        data=json.dumps(data, sort_keys=True, separators=(",", ":")), created_at=created_at,
        endpoint_id=endpoint_id, dedupe_key=dedupe_key)
    db.session.execute(statement.on_conflict_do_nothing())
    return event_id


def body(event):
    """The Standard Webhooks payload of an event row: the same bytes on every attempt."""
    created = datetime.fromtimestamp(event.created_at, timezone.utc)
    return json.dumps({"type": event.type, "timestamp": created.isoformat().replace("+00:00", "Z"),
                       "data": json.loads(event.data)}, separators=(",", ":")).encode("utf-8")


# -- usage.threshold, in the gate's statement -------------------------------------------------

def _text(value):
    return cast(value, Text)


def threshold_statement(reached=False):
    """INSERT the `usage.threshold` events the verification counted as :usage_count raises:
    one per tenant threshold whose crossing count it is (`reached`: every threshold the month
    has reached, as a move to a limited plan finds them; one raised before is not raised
    again, by its dedupe key).
    Nothing when the plan is unlimited (:plan_limit NULL) or no threshold is crossed; the
    tenant's thresholds are read by its key, a probe of a few rows."""
    alerts, events = UsageAlert.__table__, WebhookEvent.__table__
    plan_limit = bindparam("plan_limit", type_=BigInteger)
    period = bindparam("period", type_=String)
    usage_count = bindparam("usage_count", type_=BigInteger)
    threshold = alerts.c.threshold
    # ceil(limit * threshold / 100) in integers: exact in both dialects.
    crossing = (plan_limit * threshold + 99) // 100
    data = (literal('{"period":"', String) + period + literal('","rate_limit":', String)
            + _text(plan_limit) + literal(',"threshold":', String) + _text(threshold)
            + literal(',"usage_count":', String) + _text(usage_count) + literal("}", String))
    raised = select(
        bindparam("tenant_id"),
        bindparam("event_id", type_=String) + literal("_", String) + _text(threshold),
        literal(USAGE_THRESHOLD, String), data, bindparam("now", type_=BigInteger),
        literal(USAGE_THRESHOLD + ":", String) + period + literal(":", String)
        + _text(threshold),
    ).where(alerts.c.tenant_id == bindparam("tenant_id"),
            crossing <= usage_count if reached else usage_count == crossing)
    columns = [events.c.tenant_id, events.c.id, events.c.type, events.c.data,
               events.c.created_at, events.c.dedupe_key]
    return (database.current().insert(events).from_select(columns, raised)
            .on_conflict_do_nothing())


def thresholds(tenant_id):
    return [row for row in db.session.execute(
        select(UsageAlert.threshold).where(UsageAlert.tenant_id == tenant_id)
        .order_by(UsageAlert.threshold)).scalars()]


def set_thresholds(tenant_id, values):
    """Replace the tenant's thresholds (the caller holds the tenant's lock)."""
    db.session.execute(UsageAlert.__table__.delete().where(UsageAlert.tenant_id == tenant_id))
    for value in sorted(set(values)):
        db.session.add(UsageAlert(tenant_id=tenant_id, threshold=value))
    db.session.flush()
