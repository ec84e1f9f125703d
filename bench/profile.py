"""Profile the verify hot path in process (pyinstrument), against the database and Redis that
bench/run configures:  .venv/bin/python bench/profile.py [--requests 2000]"""
import argparse
import time

from pyinstrument import Profiler

from common import verify_workload


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    _, client, headers, bodies = verify_workload(args.requests)
    profiler = Profiler(interval=0.0005)
    started = time.perf_counter()
    with profiler:
        for body in bodies:
            assert client.post("/v1/intent/verify", headers=headers, json=body).get_json()["cleared"]
    elapsed = time.perf_counter() - started
    print(f"{args.requests} verifies in {elapsed:.2f}s: {elapsed / args.requests * 1000:.2f} ms each")
    print(profiler.output_text(unicode=False, color=False, show_all=False, short_mode=True))


if __name__ == "__main__":
    main()
