"""Instructions per request in process, counted by valgrind's callgrind: a figure that repeats
to within a fraction of a percent where CPU time on a shared machine does not (on this one it
varied twofold within an hour). It counts the service's side only (PostgreSQL and Redis are
other processes), through Flask's test client, against the database and Redis that bench/run
configures (its environment):
    .venv/bin/python bench/instructions.py [--route generate|verify] [--requests 400]
Each figure comes from two runs under callgrind, side by side on the two cores: the same
set-up and warm-up, with and without the measured requests; their difference, divided by the
number of requests. Compare two trees by running it in each."""
import argparse
import re
import subprocess
import sys

from common import verify_workload

WARM_UP = 50


def child(route, requests, measure):
    count = WARM_UP + requests
    _, client, headers, bodies = verify_workload(count if route == "verify" else 0)
    for number in range(count if measure else WARM_UP):
        if route == "verify":
            answer = client.post("/v1/intent/verify", headers=headers, json=bodies[number])
            assert answer.get_json()["cleared"], answer.get_data()
        else:
            answer = client.post("/v1/intent/generate", headers=headers,
                                 json={"user_token": "bench-user-token"})
            assert answer.status_code in (200, 201), answer.get_data()


def counted(route, requests, measure):
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--child", "--route", route, "--requests", str(requests),
         "--measure", str(int(measure))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def collected(process):
    _, errors = process.communicate()
    found = re.search(r"Collected : (\d+)", errors)
    if process.returncode or not found:
        sys.exit(f"callgrind run failed ({process.returncode}):\n{errors[-2000:]}")
    return int(found.group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--route", choices=("generate", "verify"), default="generate")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.route, args.requests, args.measure)
        return
    without, with_requests = (counted(args.route, args.requests, measure) for measure in (0, 1))
    spent = collected(with_requests) - collected(without)
    print(f"{args.route}: {spent / args.requests / 1e6:.3f} M instructions per request "
          f"({args.requests} requests)")


if __name__ == "__main__":
    main()
