"""CPU time by process kind, read from /proc (Linux only).

A sample sums, for every process of a kind, utime + stime + cutime + cstime. The difference of
two samples is the CPU that kind used in between, including processes that started or ended in
between: an exited child's time moves into its parent's cutime/cstime when the parent reaps it
(the postmaster reaps backends, the gunicorn master its workers), and the parent is counted too.
"""
import os
import resource
from pathlib import Path

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
KINDS = ("gunicorn", "postgres", "redis")


def processes():
    """Yield (pid, ppid, comm, cpu ticks) for every process still readable."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # comm is in parentheses and may itself contain spaces or parentheses.
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        # fields[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17.
        yield int(entry.name), int(fields[1]), comm, sum(int(value) for value in fields[11:15])


def sample(gunicorn_master):
    """CPU ms used so far by each kind; gunicorn means this master and its workers."""
    totals = dict.fromkeys(KINDS, 0.0)
    for pid, ppid, comm, ticks in processes():
        if pid == gunicorn_master or ppid == gunicorn_master:
            totals["gunicorn"] += ticks * TICK_MS
        elif comm.startswith("postgres"):
            totals["postgres"] += ticks * TICK_MS
        elif comm.startswith("redis-server"):
            totals["redis"] += ticks * TICK_MS
    # wrk is a reaped child of this process by the time the second sample is taken.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    totals["wrk"] = (children.ru_utime + children.ru_stime) * 1000
    totals["machine"] = _machine_busy_ms()
    return totals


def _machine_busy_ms():
    """CPU ms spent by all processes on all cores (everything but idle and iowait)."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user.
    busy = sum(values[:8]) - values[3] - values[4]
    return busy * TICK_MS


def per_request(before, after, requests):
    """CPU ms per request for each kind between two samples."""
    return {kind: (after[kind] - before[kind]) / max(requests, 1) for kind in before}
