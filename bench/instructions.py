"""Instructions per request in process, counted by valgrind's callgrind: a figure that repeats
to within a fraction of a percent where CPU time on a shared machine does not (on this one it
varied twofold within an hour). It counts the service's side only (PostgreSQL and Redis are
other processes), against the database and Redis that bench/run configures (its environment):
    .venv/bin/python bench/instructions.py [--route generate|verify] [--requests 400]
                                           [--without access-log,request-schema]
Requests go to the WSGI app as gunicorn hands them over, access log line included (written to
/dev/null): their environs are built before the count starts, so neither the test client nor
the workload's set-up is counted. Each figure comes from two runs under callgrind, side by side
on the two cores, with a fixed hash seed: the same set-up and warm-up, with and without the
measured requests; their difference, divided by the number of requests. Compare two trees by
running it in each.

`--without` measures what a part of the request costs: the same run with that part taken out
(the figure falls by its cost). A measurement only: what is taken out is no longer checked.
  access-log      the access log line (app.logs.log_request's record, format and write)
  request-schema  the route's marshmallow load (the body is used as sent, defaults added)
(The pool's checkout and return, 94 K instructions a verify, were taken out of the request path
itself: each thread keeps its connection, app.database.)"""
import argparse
import json
import logging
import os
import re
import subprocess
import sys

from werkzeug.test import EnvironBuilder

from common import verify_workload

WARM_UP = 50
WITHOUT = ("access-log", "request-schema")


def child(route, requests, measure, without):
    count = WARM_UP + requests
    app, _, headers, bodies = verify_workload(count if route == "verify" else 0)
    logging.getLogger().setLevel("INFO")  # the access line, as the service writes it
    sys.stderr = open(os.devnull, "w")  # pylint: disable=consider-using-with
    _take_out(app, without)
    if route == "verify":
        documents = bodies
    else:
        documents = [{"user_token": "bench-user-token"}] * count
    environs = [EnvironBuilder(path=f"/v1/intent/{route}", method="POST", headers=headers,
                               data=json.dumps(document), content_type="application/json")
                .get_environ() for document in documents]
    answered = []

    def start_response(status, _headers, _exc_info=None):
        answered.append(status)

    answers = [b"".join(app.wsgi_app(environ, start_response))
               for environ in environs[:count if measure else WARM_UP]]
    if route == "verify":
        # A blocked verify is a 200 too: every one must have cleared. Read off the bytes (the
        # service's sorted, compact JSON) rather than decoded, which would be counted too.
        assert all(answer.startswith(b'{"cleared":true,') for answer in answers), answers[:3]
    else:
        assert all(status[:3] in ("200", "201") for status in answered), answered[:3]


def _take_out(app, without):
    """Take the named parts out of the request path (see the module's docstring)."""
    if "access-log" in without:
        logging.getLogger("app.access").disabled = True
    if "request-schema" in without:
        from marshmallow import missing

        from app.intents.schemas import GenerateSchema, VerifySchema

        for schema in (GenerateSchema, VerifySchema):
            defaults = {name: field.load_default for name, field in
                        schema._declared_fields.items() if field.load_default is not missing}
            schema.load = lambda self, data, _defaults=defaults, **kwargs: {**_defaults, **data}


def counted(route, requests, measure, without):
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--child", "--route", route, "--requests", str(requests),
         "--measure", str(int(measure)), "--without", ",".join(without)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"})


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
    parser.add_argument("--without", default="",
                        help="parts taken out, comma-separated: " + ", ".join(WITHOUT))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    without = [name for name in args.without.split(",") if name]
    unknown = set(without) - set(WITHOUT)
    if unknown:
        parser.error(f"--without: unknown {', '.join(sorted(unknown))} "
                     f"(known: {', '.join(WITHOUT)})")
    if args.child:
        child(args.route, args.requests, args.measure, without)
        return
    set_up, with_requests = (counted(args.route, args.requests, measure, without)
                             for measure in (0, 1))
    spent = collected(with_requests) - collected(set_up)
    taken_out = f", without {', '.join(without)}" if without else ""
    print(f"{args.route}: {spent / args.requests / 1e6:.3f} M instructions per request "
          f"({args.requests} requests{taken_out})")


if __name__ == "__main__":
    main()
