"""The benchmark's Markdown table and chart, from the results dictionary of driver.py."""
from scenarios import BASELINE, MEAN_LATENCY_TARGETS, REFERENCE_JSON, TARGETS

CPU_KINDS = (("gunicorn", "workers"), ("postgres", "PostgreSQL"), ("redis", "Redis"))


def print_markdown(results):
    run = results["run"]
    print(f"Medians of {run['runs']} interleaved rounds of {run['duration_s']} s, "
          f"{run['workers']} gunicorn workers per app, {run['cpus']} CPUs, "
          f"commit {run['commit'][:10]}{' (dirty)' if run['dirty'] else ''}, "
          f"load average at start {run['load_average_at_start'][0]:.2f}.")
    for concurrency, rows in results["scenarios"].items():
        print(f"\nconcurrency {concurrency}\n")
        print(f"| route | req/s | x /{BASELINE} | p99 ms | p99 x /{BASELINE} | mean ms | mean x "
              f"/{BASELINE} | CPU ms per request: workers / PostgreSQL / Redis | all CPU ms per "
              f"request | PostgreSQL CPU x /{BASELINE} | WAL bytes per request |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for row in rows.values():
            used = row["cpu_ms_per_request"]
            split = " / ".join(f"{used[kind]:.2f}" for kind, _ in CPU_KINDS)
            print(f"| {row['label']} | {row['rps']:.0f} | {row['x_baseline']:.2f} | "
                  f"{row['p99_ms']:.1f} | {row['p99_x_baseline']:.2f} | "
                  f"{row['mean_ms']:.2f} | {row['mean_x_baseline']:.2f} | {split} | "
                  f"{used['machine']:.2f} | {row['pg_cpu_x_baseline']:.2f} | "
                  f"{row['wal_bytes_per_request']:.0f} |")
        print()
        for line in (target_lines(rows) + mean_latency_lines(concurrency, rows)
                     + warning_lines(rows)):
            print(line)
    growth = results.get("growth")
    if growth:
        print(f"growth: verify (cleared) at {growth['10k']['stored']:,.0f} stored intents "
              f"{growth['10k']['rps']:.0f} req/s, at {growth['1m']['stored']:,.0f} "
              f"{growth['1m']['rps']:.0f} req/s: ratio {growth['ratio_1m_to_10k']:.2f}")
    for name, peaks in results["worker_peak_rss_mb"].items():
        print(f"{name} workers' peak RSS (MiB): "
              + ", ".join(f"{value:.0f}" for value in peaks.values()))


def target_lines(rows):
    lines = []
    for name, (least_ratio, most_p99_ratio) in TARGETS.items():
        if name not in rows:
            continue
        row = rows[name]
        met = row["x_baseline"] >= least_ratio and (most_p99_ratio is None
                                                    or row["p99_x_baseline"] <= most_p99_ratio)
        wanted = f">= {least_ratio}x /{BASELINE}" + (
            f", p99 <= {most_p99_ratio}x" if most_p99_ratio is not None else "")
        lines.append(f"- target {row['label']}: {wanted}: {'met' if met else 'MISSED'} "
                     f"({row['x_baseline']:.2f}x, p99 {row['p99_x_baseline']:.2f}x)")
    return lines


def mean_latency_lines(concurrency, rows):
    lines = []
    for name, most_ratio in MEAN_LATENCY_TARGETS.get(concurrency, {}).items():
        if name in rows:
            row = rows[name]
            met = row["mean_x_baseline"] <= most_ratio
            lines.append(f"- target {row['label']}: mean latency <= {most_ratio}x /{BASELINE}: "
                         f"{'met' if met else 'MISSED'} ({row['mean_x_baseline']:.2f}x)")
    return lines


def warning_lines(rows):
    """Runs whose figures should not be trusted as they stand."""
    lines = []
    for row in rows.values():
        for number, run in enumerate(row["runs"], 1):
            problems = []
            if run["non_2xx"] or run["socket_errors"]:
                problems.append(f"{run['non_2xx']} non-2xx, {run['socket_errors']} socket errors")
            cleared = run.get("cleared_fraction")
            if row["expect_cleared"] is True and cleared < 0.999:
                problems.append(f"only {cleared:.1%} cleared (bodies reused?)")
            if row["expect_cleared"] is False and cleared:
                problems.append(f"{cleared:.1%} cleared, none expected")
            if problems:
                lines.append(f"- WARNING {row['label']}, round {number}: " + "; ".join(problems))
    return lines


def chart(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_concurrency = results["scenarios"]
    figure, axes = plt.subplots(len(by_concurrency), 3, figsize=(17, 5 * len(by_concurrency)),
                                squeeze=False)
    for (concurrency, rows), (speed, latency, spent) in zip(by_concurrency.items(), axes):
        labels = [row["label"].replace("`", "") for row in rows.values()]
        colours = ["tab:grey" if row["server"] == "reference" else "tab:blue"
                   for row in rows.values()]
        positions = range(len(labels))
        baseline, bare = rows[BASELINE], rows.get(REFERENCE_JSON)

        bars = speed.bar(positions, [row["rps"] for row in rows.values()], color=colours)
        speed.bar_label(bars, fmt="%.0f", fontsize="small")
        speed.axhline(baseline["rps"], color="black", linewidth=1, label=f"/{BASELINE}")
        speed.axhline(0.75 * baseline["rps"], color="black", linestyle="--", linewidth=1,
                      label=f"0.75x /{BASELINE}")
        if bare:
            speed.axhline(bare["rps"], color="tab:grey", linestyle=":", linewidth=1,
                          label=f"/{REFERENCE_JSON}")
        speed.set_ylabel("requests per second (median)")

        bars = latency.bar(positions, [row["p99_ms"] for row in rows.values()], color=colours)
        latency.bar_label(bars, fmt="%.1f", fontsize="small")
        latency.axhline(baseline["p99_ms"], color="black", linewidth=1, label=f"/{BASELINE} p99")
        latency.axhline(1.5 * baseline["p99_ms"], color="black", linestyle="--", linewidth=1,
                        label=f"1.5x /{BASELINE} p99")
        latency.set_ylabel("p99 latency, ms (median)")

        bottom = [0.0] * len(labels)
        for kind, name in CPU_KINDS:
            heights = [row["cpu_ms_per_request"][kind] for row in rows.values()]
            spent.bar(positions, heights, bottom=bottom, label=name)
            bottom = [low + high for low, high in zip(bottom, heights)]
        spent.bar_label(spent.containers[-1], labels=[f"{total:.2f}" for total in bottom],
                        fontsize="small")
        spent.set_ylabel("CPU ms per request (median)")

        for axis in (speed, latency, spent):
            axis.set_xticks(list(positions), labels, rotation=30, ha="right")
            axis.set_title(f"concurrency {concurrency}")
            axis.grid(True, axis="y", alpha=0.3)
            axis.legend(fontsize="small")
    run = results["run"]
    figure.suptitle(f"service (blue) and reference app (grey) on gunicorn, {run['workers']} "
                    f"workers each; PostgreSQL, Redis; medians of {run['runs']} rounds of "
                    f"{run['duration_s']} s")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
