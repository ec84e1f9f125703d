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
cat <<MSG

  Intent verification service on http://127.0.0.1:8000 (embedded defaults)
  Demo tenant:     $DEMO_EMAIL (plan pro)
  API key:         $api_key
  Signing secret:  $signing_secret

  Try:  curl -s http://127.0.0.1:8000/v1/tenant/usage -H "X-Service-Key: $api_key"

MSG
# One worker with threads: the embedded setup keeps the per-address limit in process memory.
export GUNICORN_WORKERS=${GUNICORN_WORKERS:-1} GUNICORN_THREADS=${GUNICORN_THREADS:-4}
exec "$VENV/bin/gunicorn" -c deploy/gunicorn.conf.py wsgi:app
