#!/usr/bin/env bash
# Run the service on the embedded defaults (SQLite under instance/, no Redis, built-in context
# deriver) at http://127.0.0.1:8000, with a demo tenant whose fresh credentials are printed, and
# the webhook delivery worker beside it (the demo ends with a test event sent to a receiver it
# starts on loopback: this development setup allows private addresses and http://).
# GUNICORN_BIND picks another address; SERVICE_LOG the log file (instance/service.log).
set -euo pipefail
# What the service writes here (the SQLite database, its log, the local encryption key) is
# the owner's alone: the database holds key digests and sealed signing secrets.
umask 077
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export FLASK_APP=wsgi
export GUNICORN_BIND=${GUNICORN_BIND:-127.0.0.1:8000}
SERVICE_LOG=${SERVICE_LOG:-instance/service.log}

fail() {
  echo "deploy/run-local.sh: $*" >&2
  exit 1
}

# The line of a failed command's stderr that says why: the final exception of a traceback, a
# one-line configuration error, or else the last line.
reason() {
  local text
  text=$(cat)
  printf '%s\n' "$text" | grep -E '^([A-Za-z_][A-Za-z0-9_.]*|Configuration error): ' | tail -n 1 \
    | grep . || printf '%s\n' "$text" | tail -n 1
}

[ -x "$VENV/bin/flask" ] || fail "no virtualenv at $VENV: run the README's install command first"

# The address must be free before anything else happens: otherwise the demo would run against
# whatever already answers there.
"$VENV/bin/python" - "$GUNICORN_BIND" <<'PY' || exit 1
import socket, sys

for address in sys.argv[1].split(","):
    if address.startswith(("unix:", "fd://")):
        continue
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit():
        sys.exit(f"deploy/run-local.sh: GUNICORN_BIND={address} is not HOST:PORT")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as error:
            sys.exit(f"deploy/run-local.sh: port {port} on {host} is not free ({error.strerror}); "
                     f"choose another with GUNICORN_BIND, e.g. GUNICORN_BIND={host}:{int(port) + 1}")
PY

errors=$(mktemp)
server=
worker=
# However the script ends (Ctrl-C, SIGTERM, a failed step), it stops the gunicorn and the
# webhook worker it started.
cleanup() {
  rm -f "$errors"
  for pid in $server $worker; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Run a flask command, its chatter hidden; when it fails, say which and why.
flask_quiet() {
  if ! "$VENV/bin/flask" "$@" 2>"$errors"; then
    fail "'flask $*' failed: $(reason <"$errors")"
  fi
}

flask_quiet db upgrade >/dev/null
DEMO_EMAIL=demo@example.com
if "$VENV/bin/flask" tenants show "$DEMO_EMAIL" >/dev/null 2>&1; then
  # Keys are stored only as digests, so a restart issues fresh demo credentials: the tenant's
  # first key ("default", every scope) rotated, or made again if it was revoked.
  # awk reads the list to its end: leaving early would close the pipe on a line flask has yet
  # to write, and click ends a command whose output pipe is closed with status 1, silently.
  key_id=$(flask_quiet tenants keys list "$DEMO_EMAIL" \
    | awk -F'\t' '$2 == "default" && key_id == "" {key_id = $1} END {print key_id}')
  if [ -n "$key_id" ]; then
    api_key=$(flask_quiet tenants rotate-key "$DEMO_EMAIL" --key-id "$key_id")
  else
    # Every scope, as the tenant's first key holds them (app.tenants.scopes.SCOPES).
    every_scope=$("$VENV/bin/python" -c \
      'from app.tenants.scopes import SCOPES; print(" ".join("--scope " + s for s in SCOPES))')
    # shellcheck disable=SC2086  # one word per option and scope
    api_key=$(flask_quiet tenants keys add "$DEMO_EMAIL" --name default $every_scope \
      | awk 'NR == 1 {print $NF}')
  fi
  signing_secret=$(flask_quiet tenants rotate-signing-secret "$DEMO_EMAIL")
else
  created=$(flask_quiet tenants create --email "$DEMO_EMAIL" --plan pro --json)
  api_key=$(printf '%s' "$created" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')
  signing_secret=$(printf '%s' "$created" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["signing_secret"])')
fi
# Two workers with threads: every limit lives in the SQLite file, shared by all of them.
export GUNICORN_WORKERS=${GUNICORN_WORKERS:-2} GUNICORN_THREADS=${GUNICORN_THREADS:-4}
BASE_URL="http://${GUNICORN_BIND%%,*}"
mkdir -p "$(dirname "$SERVICE_LOG")"
export WEBHOOK_ALLOW_PRIVATE_ADDRESSES=${WEBHOOK_ALLOW_PRIVATE_ADDRESSES:-true}
"$VENV/bin/gunicorn" -c deploy/gunicorn.conf.py wsgi:app 2>>"$SERVICE_LOG" &
server=$!
"$VENV/bin/flask" webhooks deliver >>"$SERVICE_LOG" 2>&1 &
worker=$!
# Wait for our own gunicorn: if it stops (the port was taken meanwhile), say so, run nothing.
"$VENV/bin/python" - "$BASE_URL/health" "$server" "$SERVICE_LOG" <<'PY' || exit 1
import os, sys, time, urllib.request

url, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(300):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"deploy/run-local.sh: gunicorn stopped before it served; see {log}")
    try:
        urllib.request.urlopen(url, timeout=1)
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit(f"deploy/run-local.sh: gunicorn did not answer {url} within 30 s; see {log}")
PY

cat <<MSG

  Intent verification service on $BASE_URL (embedded defaults; log: $SERVICE_LOG)
  Demo tenant:     $DEMO_EMAIL (plan pro)
  API key:         $api_key
  Signing secret:  $signing_secret

MSG
"$VENV/bin/python" -m intentgate.demo --base-url "$BASE_URL" --api-key "$api_key" \
  --signing-secret "$signing_secret" --ed25519
# Webhooks: a receiver on loopback, an endpoint for it, a test event through the worker.
"$VENV/bin/python" - "$BASE_URL" "$api_key" <<'PY' || fail "the webhook demo failed"
import json, sys, threading, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from intentgate import WebhookReceiver

base_url, api_key = sys.argv[1], sys.argv[2]
received, verified = threading.Event(), {}

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        event = verified["receiver"].verify(body, self.headers)
        if event["type"] == "webhook.test":
            verified["event"] = event
            received.set()
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass

def call(method, path, body=None):
    request = urllib.request.Request(base_url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"X-Service-Key": api_key,
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
endpoint = call("POST", "/v1/tenant/webhooks", {"url": url, "events": ["usage.threshold"]})
verified["receiver"] = WebhookReceiver(endpoint["secret"])
try:
    call("POST", f"/v1/tenant/webhooks/{endpoint['id']}/test")
    if not received.wait(30):
        sys.exit("deploy/run-local.sh: no test webhook arrived within 30 s")
    print(f"  webhook.test delivered and verified -> {verified['event']['id']}")
finally:
    call("DELETE", f"/v1/tenant/webhooks/{endpoint['id']}")
    server.shutdown()
PY
cat <<MSG

  Try:  curl -s $BASE_URL/v1/tenant/usage -H "X-Service-Key: $api_key"
  Stop: Ctrl-C

MSG
wait $server
