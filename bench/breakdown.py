"""Where one verify's time goes, next to one /health, measured in process against the database
and Redis that bench/run configures (no profiler overhead: wall-clock timers around each I/O).
    .venv/bin/python bench/breakdown.py [--requests 2000]"""
import argparse
import time
from collections import defaultdict

from sqlalchemy import event
from sqlalchemy.orm import Session

from common import verify_workload  # first: it puts the repository on sys.path
from app.extensions import db  # noqa: E402
from app.traffic import bucket  # noqa: E402

spent = defaultdict(float)


def timed(name, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - started
    return wrapper


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    app, client, headers, bodies = verify_workload(args.requests)
    with app.app_context():
        engine = db.engine

    # Database time per statement kind, measured at the driver (cursor.execute / commit).
    statement_started = {}

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn, cursor, statement, parameters, context, executemany):
        statement_started[id(cursor)] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn, cursor, statement, parameters, context, executemany):
        kind = ("db: verify statement" if "intentgate_verify" in statement or statement.lstrip().startswith("WITH") else
                "db: auth select" if "tenant_by_key_digest" in statement else
                "db: health select" if statement.strip() == "SELECT 1" else "db: other")
        spent[kind] += time.perf_counter() - statement_started.pop(id(cursor))

    bucket.RedisBucket.take = timed("redis: token bucket", bucket.RedisBucket.take)
    bucket.RedisBucket.available = timed("redis: ping", bucket.RedisBucket.available)
    Session.commit = timed("db: commit (incl. BEGIN/flush)", Session.commit)

    for label, call in (("verify", lambda body: client.post("/v1/intent/verify", headers=headers,
                                                            json=body)),
                        ("health", lambda body: client.get("/health"))):
        spent.clear()
        started = time.perf_counter()
        for body in bodies:
            call(body)
        total = (time.perf_counter() - started) / len(bodies) * 1000
        print(f"\n{label}: {total:.2f} ms per request (in process, sequential)")
        io = 0.0
        for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
            per = seconds / len(bodies) * 1000
            io += per
            print(f"  {name:34} {per:6.2f} ms")
        print(f"  {'everything else (Python)':34} {total - io:6.2f} ms")


if __name__ == "__main__":
    main()
