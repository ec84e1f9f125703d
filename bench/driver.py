"""Benchmark driver (started by bench/run, which sets the environment, creates both databases,
migrates the service's and creates the reference's table).

Serves the service (`wsgi:app`) and the reference app (bench/reference.py) side by side, each
under gunicorn with deploy/gunicorn.conf.py and the same settings, and drives every scenario of
bench/scenarios.py with wrk. Rounds are interleaved (round 1 runs every scenario once, then
round 2, ...), so drift on the machine hits all scenarios alike; each figure is the median over
rounds. Per run it also takes the CPU used by the target's gunicorn processes, by PostgreSQL and
by Redis (bench/cpu.py), per request served. Then verify with 10^4 and with 10^6 intents stored,
and the workers' peak RSS. Prints a Markdown table; writes bench/results/results.json and
bench/results/throughput.png.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))  # for `app`; bench/ itself is on sys.path as the script's folder

import cpu  # noqa: E402
import load  # noqa: E402
import report  # noqa: E402
from scenarios import BASELINE, SCENARIOS  # noqa: E402
from servers import Server  # noqa: E402
from workload import Workload  # noqa: E402
FIRST_RATE_GUESS = 3000  # req/s, to size single-use bodies before a scenario has been measured
GROWTH_SIZES = (("10k", 10_000), ("1m", 1_000_000))  # intents stored: the first, then the second


class Runner:
    def __init__(self, servers, workload):
        self.servers, self.workload = servers, workload
        self.fastest = {}  # scenario name -> highest req/s measured so far

    def prepare(self, scenario, duration_s):
        """Write the scenario's bodies for a run of `duration_s`; return the file (or None)."""
        if scenario.bodies is None:
            return None
        rate = self.fastest.get(scenario.name, FIRST_RATE_GUESS)
        lines = scenario.bodies(self.workload, int(rate * duration_s * 1.5) + 2000)
        path = RESULTS / f"{scenario.name}.bodies"
        path.write_text("\n".join(lines) + "\n")
        return path

    def measure(self, scenario, concurrency, duration_s, bodies, learn=True):
        server = self.servers[scenario.server]
        self.workload.settle()
        counting = scenario.expect_cleared is not None
        seen_before = self.workload.seen_responses() if counting else 0
        wal_before, before = self.workload.wal_position(), cpu.sample(server.master_pid)
        result = load.wrk(server.url + scenario.path, concurrency, duration_s, bodies,
                          scenario.api_key(self.workload) if bodies else None)
        after, wal_after = cpu.sample(server.master_pid), self.workload.wal_position()
        result["cpu_ms_per_request"] = cpu.per_request(before, after, result["requests"])
        result["wal_bytes_per_request"] = (wal_after - wal_before) / max(result["requests"], 1)
        if counting:
            result["cleared_fraction"] = ((self.workload.seen_responses() - seen_before)
                                          / max(result["requests"], 1))
        if learn:
            self.fastest[scenario.name] = max(self.fastest.get(scenario.name, 0), result["rps"])
        return result

    def run(self, scenario, concurrency, duration_s, learn=True):
        bodies = self.prepare(scenario, duration_s)
        return self.measure(scenario, concurrency, duration_s, bodies, learn)


def summarize(samples):
    summary = {key: statistics.median(sample[key] for sample in samples)
               for key in ("rps", "p50_ms", "p99_ms", "mean_ms", "wal_bytes_per_request")}
    summary["cpu_ms_per_request"] = {
        kind: statistics.median(sample["cpu_ms_per_request"][kind] for sample in samples)
        for kind in samples[0]["cpu_ms_per_request"]}
    summary["runs"] = samples
    return summary


def chosen_scenarios(only):
    """SCENARIOS, or those named in `only` (comma-separated) and the baseline they are
    compared with."""
    if not only:
        return SCENARIOS
    names = set(only.split(",")) | {BASELINE}
    unknown = names - {scenario.name for scenario in SCENARIOS}
    if unknown:
        raise SystemExit(f"--only: no scenario named {', '.join(sorted(unknown))}")
    return tuple(scenario for scenario in SCENARIOS if scenario.name in names)


def interleaved_rounds(runner, args, concurrencies):
    """Every scenario at every concurrency once per round; medians over rounds."""
    scenarios = chosen_scenarios(args.only)
    samples = {c: {s.name: [] for s in scenarios} for c in concurrencies}
    if args.warmup:
        for scenario in scenarios:  # connections, imports and caches, not measured
            runner.run(scenario, max(concurrencies), args.warmup, learn=False)
    for round_number in range(1, args.runs + 1):
        for concurrency in concurrencies:
            for scenario in scenarios:
                result = runner.run(scenario, concurrency, args.duration)
                samples[concurrency][scenario.name].append(result)
                print(f"round {round_number} c={concurrency:<3} {scenario.name:16} "
                      f"{result['rps']:8.0f} req/s  p99 {result['p99_ms']:6.1f} ms", flush=True)
    table = {}
    for concurrency, by_name in samples.items():
        rows = {name: summarize(runs) for name, runs in by_name.items()}
        for scenario in scenarios:
            row, baseline = rows[scenario.name], rows[BASELINE]
            row.update(label=scenario.label, server=scenario.server,
                       expect_cleared=scenario.expect_cleared,
                       x_baseline=row["rps"] / baseline["rps"],
                       p99_x_baseline=row["p99_ms"] / baseline["p99_ms"],
                       mean_x_baseline=row["mean_ms"] / baseline["mean_ms"],
                       # The primary is the ceiling of the whole service: its CPU per request
                       # against the reference's one durable write.
                       pg_cpu_x_baseline=(row["cpu_ms_per_request"]["postgres"]
                                          / max(baseline["cpu_ms_per_request"]["postgres"],
                                                1e-9)))
        table[str(concurrency)] = rows
    return table


def growth(runner, workload, args):
    """verify (cleared) with about 10^4 and with 10^6 intents stored, in `runs` rounds of one run
    each, interleaved as the scenarios are: the machine's drift between runs (as large as the
    effect looked for) then falls on both sizes alike. Each round starts from an empty table
    (the small one holds at least one run's fresh intents, so it may be larger than 10^4)."""
    verify = next(s for s in SCENARIOS if s.name == "verify_cleared")
    (small, _), (large, _) = GROWTH_SIZES
    samples = {label: [] for label, _ in GROWTH_SIZES}
    for _ in range(args.runs):
        workload.empty_intents()  # the earlier rounds' intents would count otherwise
        for label, target in GROWTH_SIZES:
            bodies = runner.prepare(verify, args.duration)
            stored = workload.fill_to(target)
            result = runner.measure(verify, args.growth_concurrency, args.duration, bodies)
            samples[label].append({**result, "stored": stored})
    results = {label: {**summarize(runs), "stored": statistics.median(s["stored"] for s in runs)}
               for label, runs in samples.items()}
    results[f"ratio_{large}_to_{small}"] = results[large]["rps"] / results[small]["rps"]
    return results


def about_this_run(args, concurrencies):
    def git(*command):
        return subprocess.run(["git", *command], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain")),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(), "workers": args.workers,
            "duration_s": args.duration, "runs": args.runs, "concurrencies": concurrencies,
            "baseline": BASELINE}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--concurrency", default="8", help="comma-separated wrk connections")
    parser.add_argument("--workers", type=int, default=5, help="gunicorn workers, both apps")
    parser.add_argument("--warmup", type=int, default=1, help="seconds per scenario, 0: none")
    parser.add_argument("--growth-concurrency", type=int, default=8)
    parser.add_argument("--skip-growth", action="store_true")
    parser.add_argument("--only", help="comma-separated scenario names (the baseline is kept)")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = {"run": about_this_run(args, concurrencies)}

    # BENCH_LOG_LEVEL=WARNING prices the access log line (one per request at INFO).
    log_level = os.environ.get("BENCH_LOG_LEVEL", "INFO")
    service = Server("service", "wsgi:app", "/health", args.workers,
                     RESULTS / "gunicorn-service.log", {"LOG_LEVEL": log_level})
    # The reference builds no connection in the master, and the config's preload hook is the
    # service's (it disposes app.extensions.db), so the reference never preloads.
    reference = Server("reference", "bench.reference:app", "/json", args.workers,
                       RESULTS / "gunicorn-reference.log", {"GUNICORN_PRELOAD": "false"})
    servers = {"service": service, "reference": reference}
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready()
        workload = Workload(service.url)
        runner = Runner(servers, workload)
        results["scenarios"] = interleaved_rounds(runner, args, concurrencies)
        if not args.skip_growth:
            results["growth"] = growth(runner, workload, args)
        results["worker_peak_rss_mb"] = {name: server.worker_peak_rss_mb()
                                         for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
        for bodies in RESULTS.glob("*.bodies"):
            bodies.unlink()
    results["run"]["load_average_at_end"] = os.getloadavg()

    print()
    report.print_markdown(results)
    (RESULTS / "results.json").write_text(json.dumps(results, indent=2))
    report.chart(results, RESULTS / "throughput.png")
    print(f"\nwrote {RESULTS / 'results.json'} and {RESULTS / 'throughput.png'}")


if __name__ == "__main__":
    main()
