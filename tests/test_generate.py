"""POST /v1/intent/generate: validation, the context store over real HTTP, hashes, no leaks."""
import base64
import gzip
import json
import re
import time

import pytest
import time_machine
from sqlalchemy import func, select

from app.extensions import db
from app.intents.models import Intent
from tests.support import assert_envelope, dump_database

HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
TOKEN = "user-token-0123456789"


def _jwt(claims):
    encode = lambda part: base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()
    return f"{encode({'alg': 'none'})}.{encode(claims)}.c2lnbmF0dXJl"


def _generate(client, credentials, body):
    return client.post("/v1/intent/generate", headers=credentials.headers, json=body)


def _intent_count(app):
    with app.app_context():
        return db.session.execute(select(func.count()).select_from(Intent)).scalar_one()


def test_generate_issues_an_intent(client, tenant):
    with time_machine.travel(1_800_000_000, tick=False):
        response = _generate(client, tenant, {"user_token": TOKEN, "ttl": 120})
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"intent_hash", "intent_class", "expires_at"}
    assert HASH.match(body["intent_hash"])
    assert body["intent_class"] == "other"
    assert body["expires_at"] == 1_800_000_000 + 120
    with client.application.app_context():
        stored = db.session.execute(select(Intent)).scalar_one()
    assert stored.intent_hash == body["intent_hash"] and stored.owner == f"tenant:{tenant.tenant_id}"
    assert stored.consumed_at is None


def test_default_ttl_is_an_hour(client, tenant):
    before = int(time.time())
    expires_at = _generate(client, tenant, {"user_token": TOKEN}).get_json()["expires_at"]
    assert before + 3600 <= expires_at <= int(time.time()) + 3600


@pytest.mark.parametrize(
    "body, error",
    [
        ({}, "user_token is required"),
        ({"user_token": None}, "user_token is required"),
        ({"user_token": ""}, "token too short"),
        ({"user_token": "short"}, "token too short"),
        ({"user_token": "a" * 4097}, "token too long"),
        ({"user_token": "has space 123"}, "token contains invalid characters"),
        ({"user_token": "ünïcödé-token"}, "token contains invalid characters"),
        ({"user_token": "tab\tinside-token"}, "token contains invalid characters"),
        ({"user_token": "trailing-newline\n"}, "token contains invalid characters"),
        ({"user_token": "quote'token12"}, "token contains invalid characters"),
        ({"user_token": 1234567890123}, "user_token must be a string"),
        ({"user_token": TOKEN, "ttl": 0}, "ttl must be between 1 and 86400 seconds"),
        ({"user_token": TOKEN, "ttl": 86401}, "ttl must be between 1 and 86400 seconds"),
        ({"user_token": TOKEN, "ttl": -5}, "ttl must be between 1 and 86400 seconds"),
        ({"user_token": TOKEN, "ttl": True}, "ttl must be an integer"),
        ({"user_token": TOKEN, "ttl": "60"}, "ttl must be an integer"),
        ({"user_token": TOKEN, "ttl": 1.5}, "ttl must be an integer"),
        ({"user_token": TOKEN, "ttl": None}, "ttl must be an integer"),
        ({"user_token": TOKEN, "scope": "x"}, "unknown field: scope"),
    ],
)
def test_bad_requests_get_the_contract_texts(client, tenant, body, error):
    response = _generate(client, tenant, body)
    envelope = assert_envelope(response, 400, error)
    assert envelope["details"]
    assert _intent_count(client.application) == 0
    if isinstance(body.get("user_token"), str) and len(body["user_token"]) >= 10:
        assert body["user_token"] not in response.get_data(as_text=True)


def test_token_edges_are_accepted(client, tenant):
    for token in ["a" * 10, "a" * 4096, "Az09-_.=+/~x"]:
        assert _generate(client, tenant, {"user_token": token}).status_code == 200


@pytest.mark.parametrize("data, content_type, error", [
    ("[1, 2]", "application/json", "request body must be a JSON object"),
    ("{broken", "application/json", "request body is not valid JSON"),
    ('{"user_token": "x"}', "text/plain", "Content-Type must be application/json"),
    ('{"user_token": "x"}', "application/merge-patch+json",
     "Content-Type must be application/json"),
    ('{"user_token": "x"}', "application/json; charset=latin-1",
     "request body must be UTF-8 encoded JSON"),
])
def test_malformed_bodies(client, tenant, data, content_type, error):
    response = client.post("/v1/intent/generate", headers=tenant.headers, data=data,
                           content_type=content_type)
    assert_envelope(response, 400, error)


def test_a_declared_utf8_body_is_accepted_and_a_compressed_one_is_415(client, tenant):
    body = json.dumps({"user_token": TOKEN})
    for content_type in ("application/json; charset=utf-8", "Application/JSON; charset=UTF8"):
        response = client.post("/v1/intent/generate", headers=tenant.headers, data=body,
                               content_type=content_type)
        assert response.status_code == 200
    compressed = client.post("/v1/intent/generate", data=gzip.compress(body.encode()),
                             headers={**tenant.headers, "Content-Encoding": "gzip"},
                             content_type="application/json")
    assert_envelope(compressed, 415,
                    "Content-Encoding is not supported: send the body uncompressed")
    assert compressed.headers["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("headers", [{}, {"X-Service-Key": "key_live_" + "1" * 48},
                                     {"X-Service-Key": "garbage"}])
def test_missing_or_bad_key_is_401(client, headers):
    response = client.post("/v1/intent/generate", headers=headers, json={"user_token": TOKEN})
    assert_envelope(response, 401, "invalid or missing X-Service-Key")


def test_embedded_deriver_classifies_jwt_claims(client, tenant):
    token = _jwt({"sub": "someone", "email": "person@example.com",
                  "tags": ["shopping-cart", "checkout"], "scope": "orders:write"})
    assert _generate(client, tenant, {"user_token": token}).get_json()["intent_class"] == "commerce"
    plain = _generate(client, tenant, {"user_token": "opaque-token-xyz"}).get_json()
    assert plain["intent_class"] == "other"


def test_thousand_generates_give_thousand_distinct_hashes(client, tenant):
    client.application.config["RATE_LIMIT_CAPACITY"] = 10_000
    hashes = {_generate(client, tenant, {"user_token": TOKEN}).get_json()["intent_hash"]
              for _ in range(1000)}
    assert len(hashes) == 1000 and all(HASH.match(value) for value in hashes)


def test_the_token_is_stored_and_logged_nowhere(client, tenant, caplog, capfd):
    token = "LeakCanary-7f3a9c21e-" + "Q" * 20
    jwt_token = _jwt({"tags": ["LeakCanaryClaim"], "sub": "LeakCanarySubject"})
    for user_token in (token, jwt_token):
        assert _generate(client, tenant, {"user_token": user_token}).status_code == 200
    _generate(client, tenant, {"user_token": token + " bad"})  # a rejected one too
    with client.application.app_context():
        dump = dump_database()
    logs = caplog.text + capfd.readouterr().err
    for secret in (token, jwt_token, "LeakCanarySubject", jwt_token.split(".")[1]):
        assert secret not in dump
        assert secret not in logs


def test_admin_keys_may_generate(client, runner):
    issued = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "svc", "--json"]).stdout)
    response = client.post("/v1/intent/generate", headers={"X-Service-Key": issued["api_key"]},
                           json={"user_token": TOKEN})
    assert response.status_code == 200
    with client.application.app_context():
        owner = db.session.execute(select(Intent.owner)).scalar_one()
    assert owner == f"admin:{issued['admin_key_id']}"
