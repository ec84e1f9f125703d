"""Each shared tier at saturation, for deploy/README's capacity model: what one PostgreSQL
primary and one Redis node serve when nothing else limits them, measured, not extrapolated
from CPU per request at low load.

- PostgreSQL: pgbench runs the primary's share of the service's work as the service sends it
  (the same functions, the same arguments): with the caller's principal kept in Redis
  (app.tenants.key_cache), a generate is the intent-issuing function and a verify the gate
  function, each confirming the principal; without it (a miss, or no Redis), each starts with
  the key lookup and the generate is a plain INSERT. As one pgbench transaction per
  generate-and-verify pair, generates alone and key lookups alone; the verify's share is the
  difference. For each: transactions/s, PostgreSQL CPU (from /proc) per call and per busy
  core, WAL bytes per call.
- Redis: redis-benchmark runs the bucket script (EVALSHA, one key per tenant) unpipelined and
  pipelined.

Needs PostgreSQL and Redis on localhost and the Debian packages postgresql-client (pgbench)
and redis-tools (redis-benchmark). bench/run sets the environment; or run it alone:
    .venv/bin/python bench/saturation.py [--seconds 15] [--clients 8,16]
It uses its own database (intentgate_saturation) and Redis database 2.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cpu  # noqa: E402  (bench/cpu.py)

DATABASE = "intentgate_saturation"
URL = f"postgresql://postgres@127.0.0.1/{DATABASE}"

# Each transaction is one of TENANTS tenants' (as on a primary serving many); "pair, one
# tenant" puts them all on one, whose counter rows (sharded by connection) take them all.
TENANTS = 64
PICK = f"\\set tenant random(1, {TENANTS})\n"
# The intents' owner, 'tenant:<id>'. Written as a concatenation: pgbench leaves "::" in a
# script as it is (a cast), so 'tenant::tenant' was one owner for every tenant's intents.
OWNER = "'tenant:' || :tenant"
KEY_LOOKUP = "SELECT * FROM intentgate_key_principal(':digest', ':period', :now);\n"
ISSUE = ("INSERT INTO intents (owner, intent_hash, intent_class, issued_at, expires_at) "
         f"VALUES ({OWNER}, 'sha256:' || md5(random()::text) || md5(random()::text), "
         "'other', :now, :now + 3600) RETURNING intent_hash \\gset\n")
# The principal's digest and fingerprint (kept) or NULL, NULL (just looked up).
VERIFY = (f"SELECT intentgate_verdict(:now, ':intent_hash', {OWNER}, "
          "md5(random()::text), true, :now, 60, :tenant, ':period', ':day', NULL, "
          "'evt_' || md5(random()::text), {principal});\n")
LOOKED_UP, KEPT = "NULL, NULL", "':digest', ':fingerprint'"
ISSUE_KEPT = ("SELECT made.intent_hash, intentgate_issue("
              f"made.intent_hash, {OWNER}, 'other', :now, :now + 3600, ':digest', :now, "
              "':fingerprint', :tenant, ':period', NULL) AS issued FROM (SELECT 'sha256:' || "
              "md5(random()::text) || md5(random()::text) AS intent_hash) AS made \\gset\n")
PAIR_KEPT = ISSUE_KEPT + VERIFY.format(principal=KEPT)
SCRIPTS = {"lookup": KEY_LOOKUP, "generate": PICK + ISSUE_KEPT,
           "pair": PICK + PAIR_KEPT,
           "pair, looked up": PICK + KEY_LOOKUP + ISSUE + KEY_LOOKUP
           + VERIFY.format(principal=LOOKED_UP),
           # One tenant's ceiling: all of it on tenant 1 (its counters' shards take the load).
           "pair, one tenant": "\\set tenant 1\n" + PAIR_KEPT}


def _setup():
    """A fresh database at the newest schema with TENANTS enterprise tenants (ids 1..TENANTS);
    the pgbench values (the key digest is the first tenant's: a lookup costs the same)."""
    subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", DATABASE],
                   check=True)
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", DATABASE], check=True)
    os.environ.update(DATABASE_URL=URL, REDIS_URL="", FLASK_APP="wsgi")
    if not os.environ.get("SECRET_ENCRYPTION_KEY"):  # bench/run sets one; alone, a fresh one
        os.environ["SECRET_ENCRYPTION_KEY"] = Fernet.generate_key().decode()
    return migrated_with_tenants(TENANTS)


def migrated_with_tenants(count):
    """`flask db upgrade` on the environment's DATABASE_URL, `count` enterprise tenants (ids
    1..count) made; the values of the service's calls for the first tenant's kept principal."""
    subprocess.run([sys.executable, "-m", "flask", "db", "upgrade"], cwd=ROOT, check=True,
                   capture_output=True)
    from app import create_app, crypto
    from app.clock import billing_period, now_seconds, utc_day
    from app.sql import unit_of_work
    from app.tenants import keys, service as tenant_service

    app = create_app({"LOG_LEVEL": "WARNING"})
    with app.app_context(), unit_of_work():
        first = tenant_service.create_tenant("saturation-1@example.com", "enterprise")
        for number in range(2, count + 1):
            tenant_service.create_tenant(f"saturation-{number}@example.com", "enterprise")
    assert first.tenant.id == 1
    values = {"digest": crypto.key_digest(first.api_key), "period": billing_period(),
              "now": now_seconds(), "day": utc_day()}
    with app.test_request_context():
        values["fingerprint"] = keys.find_by_key_digest(values["digest"]).fingerprint
    app.extensions["database"].engine.dispose()
    return values


def _wal_lsn():
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", DATABASE, "-tAc",
                          "SELECT pg_current_wal_lsn() - '0/0'"], check=True,
                         capture_output=True, text=True).stdout
    return int(out.strip())


def _postgres_pids():
    return {pid for pid, _ppid, comm, _ticks in cpu.processes() if comm.startswith("postgres")}


def _wait_reaped(earlier, timeout=10):
    """Wait until pgbench's backends are gone: an exiting backend's CPU shows neither in its own
    /proc entry nor in the postmaster's cutime until the postmaster reaps it, so a sample taken
    as pgbench returns can miss the whole run's CPU (seen here: 0.000 ms per call)."""
    deadline = time.monotonic() + timeout
    while _postgres_pids() - earlier and time.monotonic() < deadline:
        time.sleep(0.02)


def pgbench(script, values, clients, seconds):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(script)
    defines = [arg for name, value in values.items() for arg in ("-D", f"{name}={value}")]
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", DATABASE, "-qc",
                    "CHECKPOINT"], check=True)
    wal, backends, before = _wal_lsn(), _postgres_pids(), cpu.sample(None)
    out = subprocess.run(["pgbench", "-h", "127.0.0.1", "-U", "postgres", "-n", "-M", "simple",
                          "-c", str(clients), "-j", "2", "-T", str(seconds), *defines,
                          "-f", handle.name, DATABASE],
                         check=True, capture_output=True, text=True).stdout
    _wait_reaped(backends)
    after, wal = cpu.sample(None), _wal_lsn() - wal
    os.unlink(handle.name)
    count = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    postgres_ms = after["postgres"] - before["postgres"]
    return {"tps": count / seconds, "transactions": count,
            "postgres_cpu_ms": postgres_ms / count,
            "postgres_cores_busy": postgres_ms / 1000 / seconds,
            "wal_bytes": wal / count}


def redis_benchmark(clients, pipeline, requests=200_000):
    from app.traffic.strategy import TAKE_LUA

    client = redis.Redis(host="127.0.0.1", port=6379, db=2)
    sha = client.script_load(TAKE_LUA)
    before = cpu.sample(None)
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", "6379", "--dbnum", "2",
                          "-q", "-n", str(requests), "-c", str(clients), "-P", str(pipeline),
                          "-r", "100000", "evalsha", sha, "1", "{tenant:__rand_int__}",
                          "1000000000", "1000000000"],
                         check=True, capture_output=True, text=True).stdout
    after = cpu.sample(None)
    client.flushdb()
    rate = float(re.findall(r"([\d.]+) requests per second", out)[-1])
    return {"calls_per_s": rate, "redis_cpu_us": (after["redis"] - before["redis"]) * 1000
            / requests}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--clients", default="8,16")
    args = parser.parse_args()
    values = _setup()
    results = {"postgresql": {}, "redis": {}}
    for clients in (int(value) for value in args.clients.split(",")):
        for name, script in SCRIPTS.items():
            measured = pgbench(script, values, clients, args.seconds)
            results["postgresql"][f"{name} c={clients}"] = measured
            print(f"postgresql {name:16} c={clients:<3} {measured['tps']:8.0f} tx/s  "
                  f"PostgreSQL {measured['postgres_cpu_ms']:.3f} CPU ms/tx on "
                  f"{measured['postgres_cores_busy']:.2f} cores  "
                  f"WAL {measured['wal_bytes']:.0f} B/tx", flush=True)
            time.sleep(1)
    for clients, pipeline in ((8, 1), (50, 1), (50, 16)):
        measured = redis_benchmark(clients, pipeline)
        results["redis"][f"c={clients} P={pipeline}"] = measured
        print(f"redis bucket script c={clients:<3} P={pipeline:<3} "
              f"{measured['calls_per_s']:9.0f} calls/s  {measured['redis_cpu_us']:.1f} CPU us/call",
              flush=True)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "saturation.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {out / 'saturation.json'}")


if __name__ == "__main__":
    main()
