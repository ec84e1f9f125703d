"""Prometheus metrics. Under gunicorn with METRICS_ENABLED, samples go to the shared
PROMETHEUS_MULTIPROC_DIR (set in deploy/gunicorn.conf.py) and /metrics aggregates all workers."""
import logging
import os
import time

from flask import Blueprint, Response, current_app, g, request
from prometheus_client.core import GaugeMetricFamily
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from sqlalchemy.exc import InterfaceError, OperationalError

from app.clock import now_seconds
from app.errors import NotFound, database_failure
from app.extensions import db
from app.webhooks.service import delivery_stats

log = logging.getLogger(__name__)

bp = Blueprint("metrics", __name__)

REQUESTS = Counter("intentgate_http_requests_total", "HTTP requests by endpoint and status",
                   ["endpoint", "method", "status"])
LATENCY = Histogram("intentgate_http_request_duration_seconds", "HTTP request latency",
                    ["endpoint", "method"],
                    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
VERDICTS = Counter("intentgate_verifications_total", "Verify verdicts by outcome",
                   ["outcome"])
CONTEXT_STORE_FAILURES = Counter("intentgate_context_store_failures_total",
                                 "Context store failures by kind", ["failure"])


def record_context_store_failure(failure):
    CONTEXT_STORE_FAILURES.labels(failure=failure).inc()


# The methods a label may name; any other token a client sends counts as "other".
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


def observe(response):
    """Count the request (and a verify's verdict); registered only with METRICS_ENABLED."""
    # The route pattern, not the path, and a known method, not the client's token: label
    # values must stay few whatever a client sends (each new one is a series on every scrape).
    endpoint = request.url_rule.rule if request.url_rule else "unmatched"
    method = request.method if request.method in METHODS else "other"
    REQUESTS.labels(endpoint, method, str(response.status_code)).inc()
    started = g.get("request_started")  # set by app.http when the request began
    if started is not None:
        LATENCY.labels(endpoint, method).observe(time.perf_counter() - started)
    verdict = g.get("verdict")  # set by the verify view
    if verdict is not None:
        VERDICTS.labels(outcome=verdict).inc()
    return response


@bp.get("/metrics")
def metrics():
    if not current_app.config["METRICS_ENABLED"]:
        raise NotFound("not found")
    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    # content_type, not mimetype: CONTENT_TYPE_LATEST carries its charset already.
    return Response(generate_latest(registry) + _webhook_metrics(),
                    content_type=CONTENT_TYPE_LATEST)


def _webhook_metrics():
    """The webhook gauges, which only the database knows. While it does not answer they are
    left out (absent, not stale), and the request metrics are served all the same: an outage
    is when they are wanted most."""
    webhooks = CollectorRegistry()
    webhooks.register(WebhookDeliveries())
    try:
        return generate_latest(webhooks)
    except (OperationalError, InterfaceError) as exc:
        db.session.rollback()
        log.warning("metrics: webhook gauges left out, the database did not answer",
                    extra=database_failure(exc))
        return b""


class WebhookDeliveries:
    """Read from the database at each scrape: the delivery workers are other processes, on
    other hosts, and the outbox is the one place that knows them all."""

    def collect(self):
        outcomes, oldest_pending = delivery_stats(now_seconds())
        attempts = GaugeMetricFamily("intentgate_webhook_attempts",
                                     "Webhook attempts made in the last 30 days by outcome",
                                     labels=["outcome"])
        for outcome, count in outcomes.items():
            attempts.add_metric([outcome], count)
        yield attempts
        yield GaugeMetricFamily("intentgate_webhook_oldest_pending_seconds",
                                "Age of the oldest webhook attempt due and not yet made "
                                "(an event no worker has taken yet counts from when raised)",
                                value=oldest_pending)
