"""Benchmark driver (started by bench/run, which sets the environment and migrates the database).

Runs gunicorn against PostgreSQL and Redis and drives it with wrk: /health (the baseline),
generate (embedded context deriver), verify cleared and verify blocked, at several
concurrencies, each the median of several runs; then verify with 10,000 and with 1,000,000
intents stored; then the workers' peak RSS. Writes bench/results/results.json and a chart.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert, text  # noqa: E402

from app import create_app  # noqa: E402
from app.extensions import db  # noqa: E402
from app.intents.models import Intent  # noqa: E402
from app.intents.service import new_intent_hash  # noqa: E402
from app.tenants import service as tenant_service  # noqa: E402
from intentgate import ScaleResponse  # noqa: E402

GENERATE_BODY = json.dumps({"user_token": "eyJhbGciOiJub25lIn0.eyJ0YWdzIjpbImNhcnQiXX0.c2ln"})


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Bench:
    def __init__(self, args):
        self.args = args
        self.app = create_app()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with self.app.app_context():
            provisioned = tenant_service.create_tenant("bench@example.com", "enterprise")
            self.api_key, self.secret = provisioned.api_key, provisioned.signing_secret
            self.owner = f"tenant:{provisioned.tenant.id}"
        self.verify_rate_guess = 3000

    # -- server --------------------------------------------------------------------------------

    def start(self):
        env = {**os.environ, "GUNICORN_BIND": f"127.0.0.1:{self.port}",
               "GUNICORN_WORKERS": str(self.args.workers), "LOG_LEVEL": "INFO",
               # no worker recycling mid-measurement (a restart would show up as latency)
               "GUNICORN_MAX_REQUESTS": "0"}
        self.log = open(RESULTS / "gunicorn.log", "wb")
        self.server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "wsgi:app"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(300):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        time.sleep(2)  # let every worker finish booting

    def worker_peak_rss_mb(self):
        children = subprocess.run(["pgrep", "-P", str(self.server.pid)], capture_output=True,
                                  text=True).stdout.split()
        peaks = {}
        for pid in children:
            status = Path(f"/proc/{pid}/status").read_text()
            peaks[pid] = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
        return peaks

    def stop(self):
        self.server.send_signal(signal.SIGTERM)
        self.server.wait(60)
        self.log.close()

    # -- data ----------------------------------------------------------------------------------

    def insert_intents(self, count):
        """Insert `count` fresh intents for the bench tenant; return their hashes."""
        now = int(time.time())
        hashes = [new_intent_hash(self.owner) for _ in range(count)]
        with self.app.app_context():
            for start in range(0, count, 10_000):
                db.session.execute(insert(Intent), [
                    {"intent_hash": value, "owner": self.owner, "intent_class": "commerce",
                     "issued_at": now - 5, "expires_at": now + 86400}
                    for value in hashes[start:start + 10_000]])
                db.session.commit()
        return hashes

    def fill_to(self, stored):
        """Add other owners' intents until the table holds `stored` rows, then ANALYZE."""
        with self.app.app_context():
            have = db.session.execute(text("SELECT count(*) FROM intents")).scalar_one()
            missing = max(0, stored - have)
            if missing:
                db.session.execute(text(
                    "INSERT INTO intents (intent_hash, owner, intent_class, issued_at, expires_at)"
                    " SELECT 'sha256:' || md5(g::text || 'a' || random()) || md5(g::text || 'b'),"
                    " 'tenant:0', 'other', 0, 1 FROM generate_series(1, :n) AS g"), {"n": missing})
                db.session.commit()
            db.session.execute(text("ANALYZE intents"))
            db.session.commit()
            return db.session.execute(text("SELECT count(*) FROM intents")).scalar_one()

    def cleared_count(self):
        with self.app.app_context():
            return db.session.execute(text("SELECT count(*) FROM seen_responses")).scalar_one()

    def bodies_file(self, name, hashes):
        path = RESULTS / f"{name}.bodies"
        with open(path, "w") as out:
            for intent_hash in hashes:
                signed = ScaleResponse.sign(self.secret, intent_hash, {"answer": "benchmark"})
                out.write(json.dumps({"original_intent_hash": intent_hash,
                                      "response": signed.to_dict()}) + "\n")
        return path

    # -- load ----------------------------------------------------------------------------------

    def wrk(self, path, concurrency, bodies=None):
        threads = min(concurrency, 2)
        command = ["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{self.args.duration}s",
                   "--latency", "--timeout", "10s"]
        env = dict(os.environ, HEADER_KEY=self.api_key, WRK_THREADS=str(threads))
        if bodies is not None:
            command += ["-s", str(ROOT / "bench" / "bodies.lua")]
            env["BODIES_FILE"] = str(bodies)
        output = subprocess.run(command + [self.url + path], capture_output=True, text=True,
                                env=env, check=True).stdout
        return parse_wrk(output)

    def measure(self, scenario, concurrency):
        samples = []
        for _ in range(self.args.runs):
            if scenario == "health":
                result = self.wrk("/health", concurrency)
            elif scenario == "generate":
                result = self.wrk("/v1/intent/generate", concurrency, self.single_body("generate",
                                                                                      GENERATE_BODY))
            elif scenario == "verify_cleared":
                result = self.verify_cleared(concurrency)
            else:
                result = self.wrk("/v1/intent/verify", concurrency, self.blocked_body)
            samples.append(result)
        return summarize(samples)

    def verify_cleared(self, concurrency):
        needed = int(self.verify_rate_guess * self.args.duration * 1.5) + 2000
        bodies = self.bodies_file("verify", self.insert_intents(needed))
        before = self.cleared_count()
        result = self.wrk("/v1/intent/verify", concurrency, bodies)
        result["cleared_fraction"] = (self.cleared_count() - before) / max(result["requests"], 1)
        self.verify_rate_guess = max(self.verify_rate_guess, result["rps"])
        return result

    def single_body(self, name, body):
        path = RESULTS / f"{name}.bodies"
        path.write_text(body + "\n")
        return path

    def prepare_blocked(self):
        (intent_hash,) = self.insert_intents(1)
        path = self.bodies_file("blocked", [intent_hash])
        self.wrk("/v1/intent/verify", 1, path)  # consume it: every later verify is ReplayedIntent
        self.blocked_body = path


def parse_wrk(output):
    def duration_ms(value):
        number, unit = re.match(r"([\d.]+)(us|ms|s)", value).groups()
        return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", output, re.M))
    requests = int(re.search(r"(\d+) requests in", output).group(1))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        "p50_ms": duration_ms(latency["50"]),
        "p99_ms": duration_ms(latency["99"]),
        "requests": requests,
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": sum(map(int, errors.groups())) if errors else 0,
    }


def summarize(samples):
    summary = {key: statistics.median(sample[key] for sample in samples)
               for key in ("rps", "p50_ms", "p99_ms")}
    summary["runs"] = samples
    return summary


def chart(results, concurrencies, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for scenario, by_concurrency in results["matrix"].items():
        rps = [by_concurrency[str(c)]["rps"] for c in concurrencies]
        p99 = [by_concurrency[str(c)]["p99_ms"] for c in concurrencies]
        left.plot(concurrencies, rps, marker="o", label=scenario)
        right.plot(concurrencies, p99, marker="o", label=scenario)
    for axis, label in ((left, "requests per second (median)"), (right, "p99 latency, ms (median)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent connections")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend()
    right.axhline(20, color="grey", linestyle="--", linewidth=1)
    figure.suptitle(f"intentgate on gunicorn ({results['workers']} workers), PostgreSQL, Redis")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", default="1,2,4,8,16,32")
    parser.add_argument("--workers", type=int, default=2 * os.cpu_count() + 1)
    parser.add_argument("--growth-concurrency", type=int, default=8)
    parser.add_argument("--skip-growth", action="store_true")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)

    bench = Bench(args)
    bench.start()
    results = {"workers": args.workers, "duration_s": args.duration, "runs": args.runs,
               "matrix": {}, "growth": {}}
    try:
        bench.prepare_blocked()
        if not args.skip_growth:
            stored = bench.fill_to(10_000)
            results["growth"]["10k"] = {"stored": stored, **bench.measure("verify_cleared",
                                                                         args.growth_concurrency)}
        for scenario in ("health", "generate", "verify_cleared", "verify_blocked"):
            results["matrix"][scenario] = {}
            for concurrency in concurrencies:
                results["matrix"][scenario][str(concurrency)] = bench.measure(scenario, concurrency)
                print(f"{scenario:15} c={concurrency:<3} "
                      f"{results['matrix'][scenario][str(concurrency)]['rps']:8.0f} rps", flush=True)
        if not args.skip_growth:
            stored = bench.fill_to(1_000_000)
            results["growth"]["1m"] = {"stored": stored, **bench.measure("verify_cleared",
                                                                        args.growth_concurrency)}
            results["growth"]["ratio_1m_to_10k"] = (results["growth"]["1m"]["rps"]
                                                    / results["growth"]["10k"]["rps"])
        results["worker_peak_rss_mb"] = bench.worker_peak_rss_mb()
    finally:
        bench.stop()

    report(results, concurrencies)
    (RESULTS / "results.json").write_text(json.dumps(results, indent=2))
    chart(results, concurrencies, RESULTS / "throughput.png")
    for bodies in RESULTS.glob("*.bodies"):
        bodies.unlink()
    print(f"\nwrote {RESULTS / 'results.json'} and {RESULTS / 'throughput.png'}")


def report(results, concurrencies):
    matrix = results["matrix"]
    print(f"\n{'scenario':15} {'conc':>4} {'rps':>8} {'x health':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for scenario, by_concurrency in matrix.items():
        for concurrency in concurrencies:
            row = by_concurrency[str(concurrency)]
            ratio = row["rps"] / matrix["health"][str(concurrency)]["rps"]
            print(f"{scenario:15} {concurrency:>4} {row['rps']:8.0f} {ratio:9.2f} "
                  f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f}")
    peak = max(concurrencies, key=lambda c: matrix["verify_cleared"][str(c)]["rps"])
    verify, health = matrix["verify_cleared"][str(peak)], matrix["health"][str(peak)]
    results["peak"] = {"concurrency": peak, "verify_rps": verify["rps"],
                       "verify_p99_ms": verify["p99_ms"],
                       "verify_to_health": verify["rps"] / health["rps"]}
    print(f"\nverify (cleared) peaks at c={peak}: {verify['rps']:.0f} rps = "
          f"{verify['rps'] / health['rps']:.2f}x /health, p99 {verify['p99_ms']:.2f} ms")
    cleared = [run.get("cleared_fraction", 1) for c in concurrencies
               for run in matrix["verify_cleared"][str(c)]["runs"]]
    print(f"verify (cleared) runs: at least {min(cleared):.1%} of requests cleared")
    if results["growth"]:
        growth = results["growth"]
        print(f"growth: verify at {growth['10k']['stored']:,} stored intents "
              f"{growth['10k']['rps']:.0f} rps, at {growth['1m']['stored']:,} "
              f"{growth['1m']['rps']:.0f} rps: ratio {growth['ratio_1m_to_10k']:.2f}")
    rss = results["worker_peak_rss_mb"]
    print("worker peak RSS (MiB): " + ", ".join(f"{value:.0f}" for value in rss.values()))


if __name__ == "__main__":
    main()
