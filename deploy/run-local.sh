#!/usr/bin/env bash
# Run the service on the embedded defaults (SQLite under instance/, no Redis, built-in context
# deriver) at http://127.0.0.1:8000, with a demo tenant whose fresh credentials are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export FLASK_APP=wsgi
"$VENV/bin/flask" db upgrade 2>/dev/null
DEMO_EMAIL=demo@example.com
if "$VENV/bin/flask" tenants show "$DEMO_EMAIL" >/dev/null 2>&1; then
  # Keys are stored only as digests, so a restart issues fresh demo credentials.
  api_key=$("$VENV/bin/flask" tenants rotate-key "$DEMO_EMAIL" 2>/dev/null)
  signing_secret=$("$VENV/bin/flask" tenants rotate-signing-secret "$DEMO_EMAIL" 2>/dev/null)
else
  created=$("$VENV/bin/flask" tenants create --email "$DEMO_EMAIL" --plan pro --json 2>/dev/null)
  api_key=$(printf '%s' "$created" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')
  signing_secret=$(printf '%s' "$created" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["signing_secret"])')
fi
# One worker with threads: the embedded setup keeps the per-address limit in process memory.
export GUNICORN_WORKERS=${GUNICORN_WORKERS:-1} GUNICORN_THREADS=${GUNICORN_THREADS:-4}
export GUNICORN_BIND=${GUNICORN_BIND:-127.0.0.1:8000}
BASE_URL="http://$GUNICORN_BIND"
"$VENV/bin/gunicorn" -c deploy/gunicorn.conf.py wsgi:app 2>>instance/service.log &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' INT TERM
"$VENV/bin/python" - "$BASE_URL/health" <<'PY'
import sys, time, urllib.request
for _ in range(200):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=1)
        break
    except OSError:
        time.sleep(0.1)
PY

cat <<MSG

  Intent verification service on $BASE_URL (embedded defaults; log: instance/service.log)
  Demo tenant:     $DEMO_EMAIL (plan pro)
  API key:         $api_key
  Signing secret:  $signing_secret

MSG
"$VENV/bin/python" -m intentgate.demo --base-url "$BASE_URL" --api-key "$api_key" \
  --signing-secret "$signing_secret"
cat <<MSG

  Try:  curl -s $BASE_URL/v1/tenant/usage -H "X-Service-Key: $api_key"
  Stop: Ctrl-C

MSG
wait $server
