"""Drive one URL with wrk and read its report."""
import os
import re
import subprocess
from pathlib import Path

BODIES_SCRIPT = Path(__file__).resolve().parent / "bodies.lua"


def wrk(url, concurrency, duration_s, bodies=None, api_key=None):
    """Run wrk for `duration_s` seconds; with `bodies` (a file, one JSON body per line) POST them
    in order, each thread its own slice, with `api_key` as X-Service-Key. Return the figures."""
    threads = min(concurrency, 2)
    command = ["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{duration_s}s",
               "--latency", "--timeout", "10s"]
    env = dict(os.environ, WRK_THREADS=str(threads), HEADER_KEY=api_key or "")
    if bodies is not None:
        command += ["-s", str(BODIES_SCRIPT)]
        env["BODIES_FILE"] = str(bodies)
    output = subprocess.run(command + [url], capture_output=True, text=True, env=env,
                            check=True).stdout
    return parse(output)


def parse(output):
    def duration_ms(value):
        number, unit = re.match(r"([\d.]+)(us|ms|s)", value).groups()
        return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", output, re.M))
    mean = re.search(r"^\s+Latency\s+([\d.]+(?:us|ms|s))\s", output, re.M)  # Thread Stats' Avg
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       output)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        "p50_ms": duration_ms(latency["50"]),
        "p99_ms": duration_ms(latency["99"]),
        "mean_ms": duration_ms(mean.group(1)),
        "requests": int(re.search(r"(\d+) requests in", output).group(1)),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": sum(map(int, errors.groups())) if errors else 0,
    }
