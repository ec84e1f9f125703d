"""Small helpers shared by the tests (no fixtures here)."""
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Credentials:
    tenant_id: int
    email: str
    api_key: str
    signing_secret: str

    @property
    def headers(self):
        return {"X-Service-Key": self.api_key}


def assert_envelope(response, status, error=None):
    """The contract's error envelope: exact text, request id equal to the header."""
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert body["request_id"] == response.headers["X-Request-Id"]
    if error is not None:
        assert body["error"] == error
    return body


def sign(secret, intent_hash, match_id, timestamp, payload, scheme="bound"):
    """The AI service's side of CONTRACT.md's signature, written independently of app code."""
    import hashlib
    import hmac

    import rfc8785

    canonical = rfc8785.dumps(payload)
    message = canonical if scheme == "payload" else (
        f"{intent_hash}.{match_id}.{timestamp}.".encode() + canonical)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def scale_response(secret, intent_hash, payload=None, match_id=None, timestamp=None, **overrides):
    """A signed ScaleResponse for `intent_hash`; `overrides` replace fields after signing."""
    import time
    import uuid

    payload = {"answer": "42"} if payload is None else payload
    match_id = match_id or uuid.uuid4().hex
    timestamp = int(time.time()) if timestamp is None else timestamp
    response = {"match_id": match_id, "payload": payload, "timestamp": timestamp,
                "signature": sign(secret, intent_hash, match_id, timestamp, payload)}
    response.update(overrides)
    return response


def dump_database():
    """Every row of every table as text (for checks that a value is stored nowhere)."""
    from sqlalchemy import text

    from app.extensions import db

    lines = []
    for table in db.metadata.sorted_tables:
        for row in db.session.execute(text(f"SELECT * FROM {table.name}")):
            lines.append(" ".join(str(value) for value in row))
    return "\n".join(lines)


def set_usage(app, tenant_id, counted, period=None):
    """`period`'s (this month's by default) usage made `counted`: a count (on shard 0) or
    {shard: count}, against the plan on those monthly_usage shards and in the month's
    usage_count on its day 00 (as migration f1a3c5e7b924 carries a month counted before days;
    no listing of days shows it), all cleared."""
    from app.clock import billing_period
    from app.extensions import db
    from app.sql import unit_of_work
    from app.tenants.models import MonthlyUsage

    period = period or billing_period()
    shards = counted if isinstance(counted, dict) else {0: counted}
    with app.app_context(), unit_of_work():
        for shard, count in shards.items():
            db.session.merge(MonthlyUsage(tenant_id=tenant_id, period=period, shard=shard,
                                          usage_count=count))
        db.session.merge(cleared_day(tenant_id, f"{period}-00", 0, sum(shards.values())))


def cleared_day(tenant_id, day, shard, count):
    """A daily_usage row of `count` verifications on `day`'s `shard`, all cleared."""
    from app.tenants.models import DailyUsage

    return DailyUsage(tenant_id=tenant_id, day=day, shard=shard, verifications=count,
                      cleared=count, unknown_intent=0, expired_intent=0, replayed_intent=0,
                      invalid_signature=0, timestamp_out_of_window=0, replayed_response=0)


def postgresql_connection():
    """A psycopg2 connection of its own to TEST_DATABASE_URL: another client's transaction,
    holding locks while the service runs."""
    import psycopg2
    from sqlalchemy.engine import make_url

    from tests.conftest import TEST_DATABASE_URL

    return psycopg2.connect(make_url(TEST_DATABASE_URL).set(
        drivername="postgresql").render_as_string(False))


def wait_for_a_lock_wait(dsn, seconds=10):
    """Until some session of the database waits for a lock (the service's statement has reached
    the row another transaction holds), at most `seconds`."""
    import time

    import psycopg2

    watching = psycopg2.connect(dsn)
    watching.autocommit = True  # each look sees the activity as it is now
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with watching.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type ="
                               " 'Lock' AND datname = current_database()")
                if cursor.fetchone()[0]:
                    return
            time.sleep(0.05)
    finally:
        watching.close()
    raise AssertionError("no statement ever waited for the lock")


def raw_http(port, request, context=None):
    """Send `request` as bytes on one connection (TLS when `context` is given) and return
    (status, headers, body) of the answer: requests (and urllib3) refuse to send most of these."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    if context is not None:
        context.set_alpn_protocols(["http/1.1"])
        connection = context.wrap_socket(connection, server_hostname="127.0.0.1")
    with connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(lines[0].split()[1]), headers, body
