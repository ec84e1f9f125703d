"""Where one verify's time goes, next to one /health, measured in process against the database
and Redis that bench/run configures (no profiler overhead: wall-clock timers around each I/O).
    .venv/bin/python bench/breakdown.py [--requests 2000]"""
import argparse
import time
from collections import defaultdict

from common import verify_workload  # first: it puts the repository on sys.path
from app import database  # noqa: E402
from app.tenants import key_cache  # noqa: E402
from app.traffic import strategy  # noqa: E402

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

    # Database time per statement kind, at the DBAPI cursor the request path runs on.
    def kind(statement):
        sql = statement.sql.lstrip()
        return ("db: verify statement" if "intentgate_verif" in sql or sql.startswith("WITH") else
                "db: key lookup" if "tenant_by_key_digest" in sql else
                "db: health select" if " FROM " not in sql.upper() else "db: other")

    rows = database._rows  # pylint: disable=protected-access

    def timed_rows(on, statement, params):  # on: the app's Database
        started = time.perf_counter()
        try:
            return rows(on, statement, params)
        finally:
            spent[kind(statement)] += time.perf_counter() - started

    database._rows = timed_rows
    database._run = timed("db: BEGIN / COMMIT", database._run)
    tokens = strategy._RedisTokens  # pylint: disable=protected-access
    tokens.take_token = timed("redis: token bucket", tokens.take_token)
    tokens.peek_tokens = timed("redis: token bucket, read only", tokens.peek_tokens)
    key_cache._command = timed("redis: kept principal", key_cache._command)

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
