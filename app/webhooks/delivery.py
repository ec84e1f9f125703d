"""The delivery worker (`flask --app wsgi webhooks deliver`): fans events out of the outbox,
makes each due attempt, records it and schedules the next (CONTRACT.md, Webhooks).

Any number of workers may run on any hosts. Each step is a short transaction: a worker claims
a due attempt by leasing it (`FOR UPDATE SKIP LOCKED` on PostgreSQL, so concurrent workers
pass over each other's rows; SQLite's BEGIN IMMEDIATE serialises the claims), makes the HTTP
call outside any transaction, then records the outcome only if it still holds the lease. A
worker killed mid-attempt records nothing: when its lease runs out (WEBHOOK_LEASE_SECONDS,
longer than an attempt may last) another worker makes the attempt again. Delivery is at least
once; receivers deduplicate by webhook-id, which is the same on every attempt.

An endpoint has at most one attempt in flight across all workers (a claim passes over the
attempts of an endpoint that holds a live lease): a receiver that is slow to answer holds one
worker at a time. A claim takes the attempts of tenants with none in flight first: a tenant's
slow receivers hold at most a worker per endpoint, and only while no other tenant's attempt
is due (an attempt overdue by FAIR_WAIT_SECONDS goes in due order, so no tenant starves).
"""
import http.client
import logging
import random
import secrets
import threading
import time

from flask import current_app
from sqlalchemy import and_, exists, literal, not_, or_, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import aliased

from app import crypto
from app.clock import now_seconds
from app.errors import database_failure
from app.extensions import db
from app.sql import unit_of_work
from app.tenants.models import ApiKey
from app.webhooks import events, signatures, ssrf
from app.webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from app.webhooks.service import secrets_in_force

log = logging.getLogger(__name__)

USER_AGENT = "intentgate-webhooks/1"
DAY = 86400
# (notice, seconds before expiry it covers, down to the next notice): one event each.
EXPIRY_NOTICES = (("7d", 7 * DAY, DAY), ("1d", DAY, 0))
DISPATCH_BATCH = 100
UNSEALABLE = "the delivery worker cannot unseal the endpoint's secret"
# Seconds between tries while the database does not answer: doubled each time, up to the most.
DATABASE_RETRY_FIRST, DATABASE_RETRY_MAX = 1, 30
# The database not answering, or no connection free in the pool in time: waited out alike.
DATABASE_FAILURES = (OperationalError, InterfaceError, PoolTimeout)
FAILED_TO_ATTEMPT = "the delivery worker failed to make the attempt"
# Due attempts a claim considers when their endpoints are busy (locked by another claim, a
# secret rotation or a delete) before it waits a poll interval.
CLAIM_CANDIDATES = 5
FAIR_WAIT_SECONDS = 60  # see claim


def dispatch(now):
    """Give each undispatched event one first attempt per endpoint that receives it; return
    how many events were dispatched."""
    with unit_of_work():
        pending = db.session.execute(
            select(WebhookEvent).where(WebhookEvent.dispatched_at.is_(None))
            .order_by(WebhookEvent.created_at, WebhookEvent.id).limit(DISPATCH_BATCH)
            .with_for_update(skip_locked=True)).scalars().all()
        endpoints = {}
        for event in pending:
            if event.tenant_id not in endpoints:
                # FOR KEY SHARE: an endpoint deleted concurrently is either gone from this
                # read (the delete committed first) or waits for this transaction, never
                # deleted between the read and the first attempt that refers to it.
                endpoints[event.tenant_id] = db.session.execute(
                    select(WebhookEndpoint.id, WebhookEndpoint.events,
                           WebhookEndpoint.created_at)
                    .where(WebhookEndpoint.tenant_id == event.tenant_id)
                    .with_for_update(read=True, key_share=True)).all()
            for endpoint_id, subscribed, registered_at in endpoints[event.tenant_id]:
                # An event goes to the endpoints there were when it was raised, not to one
                # registered since (before the worker came round to it).
                if registered_at > event.created_at:
                    continue
                if (endpoint_id == event.endpoint_id if event.endpoint_id
                        else events.receives(subscribed.split(), event.type)):
                    # Due from when the event was raised (another host's clock may be ahead):
                    # claims take an endpoint's attempts by that, then by the event's id, so
                    # they go in the events' order however the workers shared the dispatch.
                    db.session.add(WebhookDelivery(
                        tenant_id=event.tenant_id, id=events.new_id("whd_"),
                        endpoint_id=endpoint_id, event_id=event.id, attempt=1,
                        scheduled_at=min(event.created_at, now), delivered=False))
            event.dispatched_at = now
    return len(pending)


def claim(now, lease_seconds):
    """Lease one due attempt of an endpoint with none in flight, a tenant with none in flight
    first; return (attempt, endpoint, event, lease token) or None."""
    token = secrets.token_hex(8)
    with unit_of_work():
        # A tenant whose receivers are slow holds a worker per endpoint it has (up to five):
        # the other tenants' attempts go first, so they wait for a worker to come free, not
        # for that tenant's queue (a probe: a healthy receiver's test event came 194 s late,
        # behind another tenant's five 15 s timeouts on three workers). An attempt overdue by
        # FAIR_WAIT_SECONDS goes in due order whatever its tenant has in flight: a tenant with
        # one endpoint always busy is not starved while the workers are.
        attempt = (_claimable(now, or_(not_(_in_flight(now, WebhookDelivery.tenant_id)),
                                       WebhookDelivery.scheduled_at <= now - FAIR_WAIT_SECONDS))
                   or _claimable(now))
        if attempt is None:
            return None
        attempt.leased_until, attempt.lease_token = now + lease_seconds, token
        # Read afresh: a running worker's session keeps the rows it loaded (expire_on_commit
        # is off), and a cached endpoint would sign with secrets rotated away since.
        endpoint = db.session.get(WebhookEndpoint, (attempt.tenant_id, attempt.endpoint_id),
                                  populate_existing=True)
        event = db.session.get(WebhookEvent, (attempt.tenant_id, attempt.event_id),
                               populate_existing=True)
    return attempt, endpoint, event, token


def _claimable(now, *conditions):
    """The first due attempt, under `conditions`, of an endpoint with none in flight, its
    endpoint locked by this claim (or None)."""
    busy = []  # endpoints found busy by this claim: the next candidate is another's
    for _ in range(CLAIM_CANDIDATES):
        # A savepoint per candidate: one whose endpoint is busy is let go of at once, so that
        # the claim holding that endpoint, which waits for its first attempt below, never
        # waits for this claim.
        candidate = db.session.begin_nested()
        attempt = _first_due(
            now, *conditions,
            not_(_in_flight(now, WebhookDelivery.tenant_id, WebhookDelivery.endpoint_id)),
            *(not_(and_(WebhookDelivery.tenant_id == tenant_id,
                        WebhookDelivery.endpoint_id == endpoint_id))
              for tenant_id, endpoint_id in busy), skip_locked=True)
        if attempt is None:
            candidate.commit()
            return None
        endpoint_key = (attempt.tenant_id, attempt.endpoint_id)
        if _endpoint_free(attempt, now):
            candidate.commit()
            # The endpoint's first due attempt, waited for: a claim that found the endpoint
            # busy may have held an earlier one's row a moment, and the statement above
            # skipped it. With the endpoint locked, this claim alone takes its attempts.
            return _first_due(now, WebhookDelivery.tenant_id == endpoint_key[0],
                              WebhookDelivery.endpoint_id == endpoint_key[1])
        candidate.rollback()
        busy.append(endpoint_key)
    return None


def _first_due(now, *conditions, skip_locked=False):
    """The first attempt due at `now` and not leased, under `conditions`, locked."""
    return db.session.execute(
        select(WebhookDelivery)
        .where(WebhookDelivery.at.is_(None), WebhookDelivery.scheduled_at <= now,
               or_(WebhookDelivery.leased_until.is_(None), WebhookDelivery.leased_until < now),
               *conditions)
        # Event ids sort by creation: an endpoint's first attempts, due from when their events
        # were raised, go in the events' order.
        .order_by(WebhookDelivery.scheduled_at, WebhookDelivery.event_id,
                  WebhookDelivery.id).limit(1)
        .with_for_update(skip_locked=skip_locked)).scalar_one_or_none()


def _in_flight(now, tenant_id, endpoint_id=None):
    """Whether an attempt of the endpoint (of any of the tenant's, without one) is leased now
    (being made)."""
    leased = aliased(WebhookDelivery)
    of_endpoint = () if endpoint_id is None else (leased.endpoint_id == endpoint_id,)
    return exists().where(leased.tenant_id == tenant_id, *of_endpoint, leased.at.is_(None),
                          leased.leased_until >= now)


def _endpoint_free(attempt, now):
    """Whether the claim may lease `attempt`: its endpoint's row locked by this claim, and no
    attempt of the endpoint leased meanwhile. The claim's first statement passed over leased
    ones as its snapshot saw them; two claims of one endpoint's attempts made at once would
    each see the other's lease too late. The lock (NO KEY UPDATE: dispatch and record take KEY
    SHARE and go on) is held to the claim's commit, and it is skipped rather than waited for (a
    delete of the endpoint locks it before its attempts, a claim after: waiting could
    deadlock); the second statement, run once the lock is held, sees any claim that held it
    before. On SQLite BEGIN IMMEDIATE has serialised the claims already."""
    locked = db.session.execute(
        select(WebhookEndpoint.id)
        .where(WebhookEndpoint.tenant_id == attempt.tenant_id,
               WebhookEndpoint.id == attempt.endpoint_id)
        .with_for_update(key_share=True, skip_locked=True)).first()
    return locked is not None and not db.session.execute(
        select(_in_flight(now, attempt.tenant_id, attempt.endpoint_id))).scalar()


def attempt_once(attempt, endpoint, event, config):
    """Make the HTTP call; return (status_code or None, error text or None, delivered)."""
    if endpoint is None or event is None:  # deleted since: its attempts are gone with it
        return None, "endpoint deleted", False
    now = now_seconds()
    try:
        signing = secrets_in_force(endpoint, now)
    except crypto.SealedSecretError:
        # Sealed with a key this worker's ring lacks (a newer ring elsewhere): the attempt
        # fails and is retried as any other, so a worker with that key delivers it, and the
        # other endpoints' attempts go on.
        log.error("a webhook secret cannot be unsealed with SECRET_ENCRYPTION_KEY",
                  extra={"tenant_id": endpoint.tenant_id, "webhook_id": endpoint.id})
        return None, UNSEALABLE, False
    body = events.body(event)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               **signatures.headers(signing, event.id, now, body)}
    try:
        status, _ = ssrf.post(endpoint.url, body, headers,
                              config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"],
                              config["WEBHOOK_CONNECT_TIMEOUT"], config["WEBHOOK_TIMEOUT"],
                              ca_file=config["WEBHOOK_CA_FILE"])
    except ssrf.Refused as refused:
        return None, str(refused), False
    except TimeoutError:
        return None, "no answer within the deadline", False
    except (OSError, http.client.HTTPException) as exc:
        return None, f"connection failed: {type(exc).__name__}", False
    if 200 <= status < 300:
        return status, None, True
    if 300 <= status < 400:
        return status, "redirect not followed", False
    return status, f"status {status}", False


def release(claimed):
    """Let go of a claimed attempt not made: due again at once, for any worker."""
    attempt, _, _, token = claimed
    with unit_of_work():
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.tenant_id == attempt.tenant_id,
                   WebhookDelivery.id == attempt.id, WebhookDelivery.lease_token == token)
            .values(leased_until=None, lease_token=None))


def record(attempt, token, outcome, config, now):
    """Record the attempt (if this worker still holds its lease) and schedule the next one,
    or give the event up after the last."""
    status_code, error, delivered = outcome
    delays = config["WEBHOOK_RETRY_DELAYS"]
    next_at = None
    if not delivered and attempt.attempt <= len(delays):
        delay = delays[attempt.attempt - 1]
        next_at = now + round(delay * random.uniform(0.9, 1.1))  # jitter: no thundering herd
    with unit_of_work():
        # The endpoint first (FOR KEY SHARE), as in dispatch: deleting it removes this attempt
        # (ON DELETE CASCADE), so a delete either came first and there is nothing to record,
        # or waits until the next attempt is scheduled and removes it too. Locked in the
        # delete's own order (endpoint, then its attempts), the two never deadlock.
        made = _endpoint_kept(attempt) and db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.tenant_id == attempt.tenant_id,
                   WebhookDelivery.id == attempt.id, WebhookDelivery.lease_token == token,
                   WebhookDelivery.at.is_(None))
            .values(at=now, status_code=status_code, error=error, delivered=delivered,
                    next_attempt_at=next_at, leased_until=None)).rowcount
        if made and next_at is not None:
            db.session.add(WebhookDelivery(
                tenant_id=attempt.tenant_id, id=events.new_id("whd_"),
                endpoint_id=attempt.endpoint_id, event_id=attempt.event_id,
                attempt=attempt.attempt + 1, scheduled_at=next_at, delivered=False))
    log.info("webhook attempt", extra={
        "tenant_id": attempt.tenant_id, "webhook_id": attempt.endpoint_id,
        "event_id": attempt.event_id, "attempt": attempt.attempt, "status": status_code,
        "outcome": "delivered" if delivered else ("retrying" if next_at else "failed"),
        "recorded": bool(made)})
    return bool(made)


def _endpoint_kept(attempt):
    return db.session.execute(
        select(WebhookEndpoint.id)
        .where(WebhookEndpoint.tenant_id == attempt.tenant_id,
               WebhookEndpoint.id == attempt.endpoint_id)
        .with_for_update(read=True, key_share=True)).first() is not None


def raise_expiring_keys(now):
    """api_key.expiring 7 days and 1 day before a key expires, once each (the dedupe key)."""
    raised = 0
    with unit_of_work():
        for notice, before, until in EXPIRY_NOTICES:
            dedupe = literal(events.API_KEY_EXPIRING + ":") + ApiKey.id + literal(":" + notice)
            due = db.session.execute(
                select(ApiKey.tenant_id, ApiKey.id, ApiKey.expires_at)
                .where(ApiKey.revoked_at.is_(None), ApiKey.expires_at > now + until,
                       ApiKey.expires_at <= now + before,
                       not_(exists().where(and_(WebhookEvent.tenant_id == ApiKey.tenant_id,
                                                WebhookEvent.dedupe_key == dedupe))))).all()
            for tenant_id, key_id, expires_at in due:
                raised += events.raise_event(
                    tenant_id, events.API_KEY_EXPIRING,
                    {"key_id": key_id, "expires_at": expires_at}, now,
                    dedupe_key=f"{events.API_KEY_EXPIRING}:{key_id}:{notice}") is not None
    return raised


def make(claimed, config):
    """Make a claimed attempt and record its outcome."""
    attempt, endpoint, event, token = claimed
    try:
        outcome = attempt_once(attempt, endpoint, event, config)
    except Exception:  # noqa: BLE001 - a defect or a damaged row: a failed attempt, retried
        # Recorded, so that the retries' schedule goes on: unrecorded, the attempt would be
        # made again at each lease's end, ahead of its endpoint's other events, for ever.
        log.exception("webhook attempt failed", extra={"webhook_id": attempt.endpoint_id,
                                                       "event_id": attempt.event_id})
        outcome = None, FAILED_TO_ATTEMPT, False
    record(attempt, token, outcome, config, now_seconds())


def deliver_due(config, now=None):
    """One pass: dispatch new events, make every attempt due now; return how many were made."""
    made = 0
    while dispatch(now_seconds() if now is None else now):
        pass
    while True:
        claimed = claim(now_seconds() if now is None else now, config["WEBHOOK_LEASE_SECONDS"])
        if claimed is None:
            return made
        make(claimed, config)
        made += 1


class StopRequest:
    """SIGTERM's (or Ctrl-C's) request that the worker's loop stop.

    `request` is called by the signal handler, on the main thread between two bytecodes. It
    marks the request at once, so that no step the loop has yet to check it before (a claim,
    an attempt) starts after the signal; a thread wakes the loop from its wait. Not the event
    itself: the handler may run inside Event.wait() while that holds the event's lock, and
    set() would wait for the lock for ever (seen: a worker that never stopped, its stack in
    set() under wait())."""

    def __init__(self):
        self.requested = False
        self._wake = threading.Event()

    def request(self):
        self.requested = True
        threading.Thread(target=self._wake.set, daemon=True).start()

    def is_set(self):
        return self.requested

    def wait(self, seconds):
        self._wake.wait(seconds)


def run(stopping):
    """The worker's loop, until `stopping` (a StopRequest) is set: an attempt in flight is
    finished first, so SIGTERM never cuts one short, and none starts after it: an attempt
    claimed as the signal came is let go of, due at once for another worker.

    A database that fails (a restart, a failover, an outage) is waited out, as the service's
    own workers wait it out: the worker says so, pauses, and goes on with a new connection.
    Exiting would leave the outbox undelivered wherever nothing restarts the worker (the
    compose stack, deploy/run-local.sh). Each step is its own transaction, so a step cut short
    wrote nothing; an attempt made but not recorded is made again when its lease runs out."""
    config = current_app.config
    next_sweep = 0.0
    pause = DATABASE_RETRY_FIRST
    log.info("webhook worker started")
    while not stopping.is_set():
        try:
            if time.monotonic() >= next_sweep:
                raise_expiring_keys(now_seconds())
                next_sweep = time.monotonic() + config["WEBHOOK_SWEEP_SECONDS"]
            busy = dispatch(now_seconds())
            claimed = None if stopping.is_set() else claim(now_seconds(),
                                                           config["WEBHOOK_LEASE_SECONDS"])
            if claimed is not None and stopping.is_set():
                release(claimed)
            elif claimed is not None:
                make(claimed, config)
            elif not busy:
                stopping.wait(config["WEBHOOK_POLL_SECONDS"])
            pause = DATABASE_RETRY_FIRST
        except DATABASE_FAILURES as exc:
            log.error("webhook worker: database unavailable, trying again in %s s", pause,
                      extra=database_failure(exc))
            stopping.wait(pause)
            pause = min(pause * 2, DATABASE_RETRY_MAX)
    log.info("webhook worker stopped")
