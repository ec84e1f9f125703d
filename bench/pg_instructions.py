"""PostgreSQL's instructions per call, counted by valgrind's callgrind: the primary's share of a
verify and of a generate (a principal kept in Redis: the gate and the intent-issuing function,
each confirming it), against the reference's `UPDATE ... RETURNING` on a hot row, each its own
transaction and commit. A figure that repeats to about 1 % where CPU time on this shared machine
does not (issue 24 chose the gate's design from it). User-space instructions only: the socket,
the WAL flush and the kernel's work are common to every transaction and not counted.

A scratch cluster of its own (initdb in a temporary directory, the postgres user when run as
root), migrated to head with one enterprise tenant and 200,000 stored intents; then, for each
script, two single-user backends (`postgres --single`) under callgrind, of 1,000 and 3,000 calls:
the difference over 2,000 calls leaves out the start, the catalog's first reads and the plans'
first preparation. Needs PostgreSQL's server binaries (pg_config --bindir, or
/usr/lib/postgresql/<version>/bin) and valgrind; takes about 4 minutes:
    .venv/bin/python bench/pg_instructions.py
"""
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cryptography.fernet import Fernet

import saturation  # bench/saturation.py: the same migrated database and tenant


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


PORT = _free_port()
INTENTS = 200_000
SMALL, BIG = 1000, 3000


def _bindir():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if found:
        return Path(found[-1]).parent
    return Path(subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True,
                               text=True).stdout.strip())


def _as_postgres(command):
    """Run `command` as the postgres user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    return subprocess.run(command, check=True, capture_output=True, text=True)


def _psql(sql):
    subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "-d", "bench",
                    "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True, capture_output=True)


def _prepare(bindir, data):
    """The cluster at head, with its tenant, intents and hot row; the tenant's credentials."""
    _as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"])
    _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-o", f"-p {PORT} -k {data}", "-w",
                  "-l", str(data / "log"), "start"])
    try:
        subprocess.run(["createdb", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "bench"],
                       check=True)
        os.environ.update(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{PORT}/bench",
                          REDIS_URL="", FLASK_APP="wsgi",
                          SECRET_ENCRYPTION_KEY=Fernet.generate_key().decode())
        values = saturation.migrated_with_tenants(1)
        now = values["now"]
        _psql("CREATE TABLE bench_counter (id integer PRIMARY KEY, n bigint NOT NULL);"
              "INSERT INTO bench_counter VALUES (1, 0)")
        _psql("INSERT INTO intents (owner, intent_hash, intent_class, issued_at, expires_at) "
              "SELECT 'tenant:1', 'sha256:' || md5(g::text) || md5((g + 1)::text), 'other', "
              f"{now}, {now + 86400} FROM generate_series(1, {INTENTS}) g")
        _psql("INSERT INTO intents (owner, intent_hash, intent_class, issued_at, expires_at) "
              f"SELECT 'tenant:1', 'sha256:t' || g, 'other', {now}, {now + 86400} "
              f"FROM generate_series(1, {SMALL + BIG}) g")
        _psql("VACUUM ANALYZE")
        return values
    finally:
        _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-w", "stop"])


def _scripts(values):
    """name -> (calls of the small run, calls of the big one): SQL lines, each a transaction,
    as the service sends them (app.database.ScalarProcedure.call)."""
    v = values

    def verify(number):
        return (f"SELECT intentgate_verdict({v['now']}, 'sha256:t{number}', 'tenant:1', "
                f"'m{number}', true, {v['now']}, 60, 1, '{v['period']}', '{v['day']}', NULL, "
                f"'evt_{number}', '{v['digest']}', '{v['fingerprint']}') AS reason;\n")

    def generate(number):
        return (f"SELECT intentgate_issue('sha256:g{number}', 'tenant:1', 'other', {v['now']}, "
                f"{v['now'] + 3600}, '{v['digest']}', {v['now']}, '{v['fingerprint']}', 1, "
                f"'{v['period']}', NULL) AS issued;\n")

    def reference(_number):
        return "UPDATE bench_counter SET n = n + 1 WHERE id = 1 RETURNING n;\n"

    runs = {}
    for name, line in (("reference", reference), ("verify", verify), ("generate", generate)):
        runs[name] = ("".join(line(n) for n in range(1, SMALL + 1)),
                      "".join(line(n) for n in range(SMALL + 1, SMALL + BIG + 1)))
    return runs


def _instructions(bindir, data, script, out):
    """Instructions of one single-user backend running `script` under callgrind."""
    (out / "script.sql").write_text(script)
    profile = out / "callgrind.out"
    command = (f"valgrind --tool=callgrind --callgrind-out-file={profile} "
               f"{bindir / 'postgres'} --single -D {data} bench < {out / 'script.sql'} "
               f"> {out / 'stdout'} 2> {out / 'stderr'}")
    _as_postgres(["sh", "-c", command])
    answers = (out / "stdout").read_text()
    if "ERROR" in answers:
        raise SystemExit(f"the backend answered an error: {answers[answers.index('ERROR'):][:300]}")
    summary = next(line for line in profile.read_text().splitlines()
                   if line.startswith("summary:"))
    return int(summary.split()[1])


def main():
    keep = "--keep" in sys.argv[1:]  # the cluster and the profiles, to read with callgrind_annotate
    bindir, work = _bindir(), Path(tempfile.mkdtemp(prefix="pg-instructions-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(work, "postgres")
        data = work / "data"
        values = _prepare(bindir, data)
        results = {}
        for name, (small, big) in _scripts(values).items():
            started = time.monotonic()
            counts = []
            for script in (small, big):
                out = Path(tempfile.mkdtemp(dir=work))
                if os.geteuid() == 0:
                    shutil.chown(out, "postgres")
                counts.append(_instructions(bindir, data, script, out))
            results[name] = (counts[1] - counts[0]) / (BIG - SMALL)
            print(f"{name:10} {results[name]:10,.0f} instructions per call "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
        for name in ("verify", "generate"):
            print(f"{name}: {results[name] / results['reference']:.2f}x the reference's")
    finally:
        if keep:
            print(f"kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
