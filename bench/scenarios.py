"""What one benchmark run measures: one row per scenario, in the order of the table printed.

To add a scenario, add one entry to SCENARIOS. `bodies(workload, count)` returns the POST
bodies (one JSON document per line) for a run of up to `count` requests: as many fresh ones as
a single-use request needs, or one line that wrk repeats; leave it out for a GET. `api_key`
picks the X-Service-Key sent with the bodies. `expect_cleared` makes the driver count the
verifications cleared during the run (True: all of them should be; False: none).
"""
from dataclasses import dataclass
from typing import Callable, Optional

from workload import GENERATE_BODY, Workload

BASELINE = "pg"  # ratios are to this scenario's req/s and p99
REFERENCE_JSON = "json"  # drawn as a line on the chart as well
# Issue 12's targets: (least req/s as a multiple of BASELINE's, most p99 as a multiple of its p99)
TARGETS = {"verify_cleared": (0.75, 1.5), "generate": (0.75, 1.5), "health": (1.0, None)}
# Issue 24's: at concurrency 1, the most mean latency as a multiple of BASELINE's
MEAN_LATENCY_TARGETS = {"1": {"verify_cleared": 1.5}}


@dataclass(frozen=True)
class Scenario:
    name: str  # key in results.json
    label: str  # row in the table and bar on the chart
    server: str  # "service" or "reference"
    path: str
    bodies: Optional[Callable[[Workload, int], list]] = None
    api_key: Callable[[Workload], str] = lambda workload: workload.api_key
    expect_cleared: Optional[bool] = None


def fresh_verify_bodies(workload, count):
    return workload.verify_lines(workload.insert_intents(count))


def fresh_ed25519_verify_bodies(workload, count):
    return workload.verify_lines(workload.insert_intents(count, workload.ed25519_owner),
                                 ed25519=True)


SCENARIOS = (
    Scenario("json", "`/json` reference", "reference", "/json"),
    Scenario("pg", "`/pg` reference", "reference", "/pg"),
    Scenario("health", "`/health`", "service", "/health"),
    Scenario("generate", "generate, embedded deriver", "service", "/v1/intent/generate",
             bodies=lambda workload, count: [GENERATE_BODY]),
    Scenario("verify_cleared", "verify, cleared", "service", "/v1/intent/verify",
             bodies=fresh_verify_bodies, expect_cleared=True),
    Scenario("verify_ed25519", "verify, cleared, ed25519", "service", "/v1/intent/verify",
             bodies=fresh_ed25519_verify_bodies,
             api_key=lambda workload: workload.ed25519_api_key, expect_cleared=True),
    Scenario("verify_blocked", "verify, blocked (replayed)", "service", "/v1/intent/verify",
             bodies=lambda workload, count: [workload.replayed_verify_line],
             expect_cleared=False),
)
