"""The OpenAPI document describes the API, and the API keeps to it under generated input."""
import json
import os
import re
import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from app.intents.reasons import BLOCK_REASONS
from tests.support import assert_envelope

GUARD_ERRORS = {"400", "401", "403", "413", "415", "429", "501", "503"}


def _routes(app):
    """(path, method) of every /v1 route and /health, read from the app's url_map."""
    return {(re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule), method.lower())
            for rule in app.url_map.iter_rules()
            if rule.rule.startswith("/v1/") or rule.rule == "/health"
            for method in rule.methods - {"HEAD", "OPTIONS"}}


def _operations(document):
    return {(path, method): operation for path, item in document["paths"].items()
            for method, operation in item.items()}


def test_the_document_covers_every_endpoint_and_reason(client):
    document = client.get("/openapi.json").get_json()
    assert document["openapi"].startswith("3.")
    operations = {(path, method) for path, item in document["paths"].items() for method in item}
    assert operations == {
        ("/health", "get"), ("/v1/intent/generate", "post"), ("/v1/intent/verify", "post"),
        ("/v1/tenant/usage", "get"), ("/v1/tenant/rotate-key", "post"),
        ("/v1/admin/tenants", "post"), ("/v1/admin/tenants", "get"),
        ("/v1/admin/tenants/{tenant_id}", "get"), ("/v1/admin/tenants/{tenant_id}", "patch")} | {
        (prefix + path, method) for prefix in ("/v1/tenant", "/v1/admin/tenants/{tenant_id}")
        for path, method in (("/signing-keys", "get"), ("/signing-keys", "post"),
                             ("/signing-keys/{key_id}", "delete"), ("/signature-scheme", "put"),
                             ("/signing-secret/rotate", "post"), ("/keys", "get"),
                             ("/keys", "post"), ("/keys/{key_id}", "delete"),
                             ("/audit-log", "get"), ("/usage/daily", "get"),
                             ("/webhooks", "get"), ("/webhooks", "post"),
                             ("/webhooks/{webhook_id}", "delete"),
                             ("/webhooks/{webhook_id}/rotate-secret", "post"),
                             ("/webhooks/{webhook_id}/test", "post"),
                             ("/webhooks/{webhook_id}/deliveries", "get"),
                             ("/usage-alerts", "get"), ("/usage-alerts", "put"))}
    result = document["components"]["schemas"]["VerificationResult"]["properties"]["reason"]
    assert set(BLOCK_REASONS) <= set(result["enum"])
    verify = document["paths"]["/v1/intent/verify"]["post"]
    assert {"200", "400", "401", "422", "429"} <= set(verify["responses"])
    assert "Idempotency-Key" in [p["name"] for p in verify["parameters"]]
    assert "X-RateLimit-Remaining" in verify["responses"]["200"]["headers"]
    assert document["components"]["securitySchemes"]["ServiceKey"]["name"] == "X-Service-Key"
    assert set(document["components"]["schemas"]["Error"]["required"]) == {"error", "request_id"}


@pytest.fixture
def keys(app, runner, make_tenant, leak_watch):
    app.config.update(RATE_LIMIT_CAPACITY=1_000_000, AUTH_FAILURE_LIMIT="100000 per minute")
    tenant = make_tenant("enterprise")
    admin = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "fuzz", "--json"]).stdout)
    leak_watch.add(admin["api_key"], admin["signing_secret"])
    leak_watch.watch_requests = False  # generated input; the real keys above stay watched
    return {"tenant": tenant.api_key, "admin": admin["api_key"]}


def test_generated_requests_get_documented_answers(app, keys):
    """schemathesis over every operation (40 cases each, valid and invalid input): no 5xx, and
    every status, header and body matches the document."""
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 45
    assert {(operation.path, operation.method) for operation in operations} == _routes(app)
    for operation in operations:
        key = keys["admin"] if operation.path.startswith("/v1/admin") else keys["tenant"]
        # A schema cannot say which 32 bytes are an Ed25519 point of the prime-order subgroup
        # (about one in sixteen): a schema-valid public key is usually a 400 there, rightly.
        # Nor which host name resolves to public addresses only (a webhook URL).
        excluded = [positive_data_acceptance] if (
            operation.path.endswith(("/signing-keys", "/webhooks"))
            and operation.method == "post") else []

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, database=None,
                  derandomize=os.environ.get("CI") == "true",  # fixed draws in CI
                  suppress_health_check=list(HealthCheck))
        def exercise(case):
            if case.headers and "Idempotency-Key" in case.headers:
                # A key reused with another body is a documented 422; each case is a new request.
                case.headers["Idempotency-Key"] = uuid.uuid4().hex
            case.call_and_validate(headers={"X-Service-Key": key}, excluded_checks=excluded)

        exercise()


def test_every_route_is_in_the_document(app, client):
    """The document is built from the views: a new /v1 route or /health cannot be missing."""
    document = client.get("/openapi.json").get_json()
    assert set(_operations(document)) == _routes(app)


def test_every_v1_operation_documents_its_key_rate_limit_and_errors(app, client):
    app.config["AUTH_FAILURE_LIMIT"] = "1000 per minute"  # one keyless call per operation below
    document = client.get("/openapi.json").get_json()
    components = document["components"]
    assert components["securitySchemes"]["ServiceKey"] == {
        "type": "apiKey", "in": "header", "name": "X-Service-Key"}
    assert components["headers"]["X-Request-Id"]["required"] is True
    for (path, method), operation in _operations(document).items():
        responses = operation["responses"]
        success = [status for status in responses if status.startswith("2")]
        created = method == "post" and path.endswith(("/tenants", "/keys", "/signing-keys",
                                                      "/webhooks"))
        queued = method == "post" and path.endswith("/test")  # a webhook.test event
        assert success == (["201"] if created else ["202"] if queued else ["200"]), \
            (path, method)
        for status, response in responses.items():
            headers = set(response["headers"])
            assert "X-Request-Id" in headers
            if path.startswith("/v1/"):
                assert {"X-RateLimit-Limit", "X-RateLimit-Remaining",
                        "X-RateLimit-Reset"} <= headers, (path, method, status)
            if status in ("429", "503"):
                assert "Retry-After" in headers
            if not status.startswith("2") and path != "/health":
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (path, method, status)
        if path.startswith("/v1/"):
            assert operation["security"] == [{"ServiceKey": []}]
            assert GUARD_ERRORS <= set(responses), (path, method)
            assert "422" not in responses or path == "/v1/intent/verify"
            # What the document claims of every /v1 operation holds: no key, 401.
            concrete = path.replace("{tenant_id}", "1").replace("{key_id}", "k1")
            assert_envelope(client.open(concrete, method=method.upper()), 401)
        else:
            assert operation["security"] == []
    operations = _operations(document)
    assert {"404"} <= set(operations[("/v1/admin/tenants/{tenant_id}", "get")]["responses"])
    assert {"409"} <= set(operations[("/v1/admin/tenants", "post")]["responses"])
    assert {"502"} <= set(operations[("/v1/intent/generate", "post")]["responses"])
    assert "Idempotent-Replayed" in operations[("/v1/intent/verify", "post")]["responses"][
        "200"]["headers"]


def test_parameters_and_bodies_come_from_the_views(client):
    operations = _operations(client.get("/openapi.json").get_json())
    listed = {parameter["name"]: parameter
              for parameter in operations[("/v1/admin/tenants", "get")]["parameters"]}
    assert listed["limit"]["in"] == "query" and listed["limit"]["schema"]["minimum"] == 1
    assert listed["limit"]["schema"]["maximum"] == 200
    assert listed["starting_after"]["schema"]["maximum"] == 2**31 - 1
    for method in ("get", "patch"):
        parameters = operations[("/v1/admin/tenants/{tenant_id}", method)]["parameters"]
        assert {"name": "tenant_id", "in": "path", "required": True,
                "schema": {"type": "integer", "minimum": 0}} in parameters
    verify = operations[("/v1/intent/verify", "post")]
    assert verify["requestBody"]["required"] is True
    # Rotation takes no fields and may have no body at all.
    assert operations[("/v1/tenant/rotate-key", "post")]["requestBody"]["required"] is False
    assert "requestBody" not in operations[("/v1/tenant/usage", "get")]


def test_only_the_document_is_served(app, client):
    """flask-smorest adds no route of its own (no Swagger UI, ReDoc or RapiDoc pages), and Flask
    none for static files (its /static route answered OPTIONS with GET allowed)."""
    others = {rule.rule for rule in app.url_map.iter_rules()
              if not (rule.rule.startswith("/v1/") or rule.rule == "/health")}
    assert others == {"/openapi.json", "/metrics"}
    for page in ("/swagger-ui", "/redoc", "/rapidoc", "/docs", "/static/app.js"):
        assert_envelope(client.get(page), 404, "not found")
    assert_envelope(client.options("/static/app.js"), 404, "not found")


def test_decorated_views_parse_bodies_and_queries_as_before(client, tenant, runner, leak_watch):
    """@bp.arguments reads through json_body and the schema: the contract's 400s, fields named
    at the top level, never webargs' 422 or its {"json": ...} nesting."""
    admin = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "parse",
                                           "--json"]).stdout)
    leak_watch.add(admin["api_key"], admin["signing_secret"])
    headers = {"X-Service-Key": admin["api_key"]}
    body = assert_envelope(client.post("/v1/admin/tenants", headers=headers,
                                       json={"email": "a@example.com", "bogus": 1}), 400,
                           "unknown field: bogus")
    assert body["details"] == {"bogus": ["unknown field"]}
    assert_envelope(client.post("/v1/admin/tenants", headers=headers, data="[]",
                                content_type="application/json"), 400,
                    "request body must be a JSON object")
    assert_envelope(client.post("/v1/admin/tenants", headers=headers, data="{}",
                                content_type="text/plain"), 400,
                    "Content-Type must be application/json")
    assert_envelope(client.get("/v1/admin/tenants?limit=+5", headers=headers), 400,
                    "limit must be an integer between 1 and 200")
    assert_envelope(client.get("/v1/admin/tenants?starting_after=-1", headers=headers), 400,
                    "starting_after must be an integer between 0 and 2147483647")
    listed = client.get("/v1/admin/tenants?limit=1&utm_source=x", headers=headers)
    assert listed.status_code == 200 and len(listed.get_json()["tenants"]) == 1
    # An optional body: absent, or {}, but still no unknown field.
    rotated = client.post("/v1/tenant/rotate-key", headers=tenant.headers)
    assert rotated.status_code == 200
    leak_watch.add(rotated.get_json()["new_key"])
    assert_envelope(client.post("/v1/tenant/rotate-key",
                                headers={"X-Service-Key": rotated.get_json()["new_key"]},
                                json={"x": 1}), 400, "unknown field: x")


def test_what_the_document_allows_the_service_takes(client, tenant, admin_headers, leak_watch,
                                                    app):
    """Clients that check requests against /openapi.json before sending: every event type it
    lists, a PEM public key and an address such as a@b.c validate there and are taken here."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    app.config["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"] = True
    schemas = client.get("/openapi.json").get_json()["components"]["schemas"]

    def valid(schema, body):
        """`body`, once each string member passed its property's pattern and enum."""
        for name, value in body.items():
            rules = schemas[schema]["properties"][name]
            for text in value if isinstance(value, list) else [value]:
                rule = rules.get("items", {}) if isinstance(value, list) else rules
                assert re.search(rule.get("pattern", ""), text), (schema, name)
                assert text in rule.get("enum", [text]), (schema, name)
        return body

    events = schemas["WebhookCreate"]["properties"]["events"]["items"]["enum"]
    created = client.post("/v1/tenant/webhooks", headers=tenant.headers, json=valid(
        "WebhookCreate", {"url": "http://127.0.0.1:9/hooks", "events": events}))
    assert created.status_code == 201, created.get_json()
    leak_watch.add(created.get_json()["secret"])
    pem = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    added = client.post("/v1/tenant/signing-keys", headers=tenant.headers,
                        json=valid("SigningKeyCreate", {"public_key": pem}))
    assert added.status_code == 201, added.get_json()
    made = client.post("/v1/admin/tenants", headers=admin_headers,
                       json=valid("TenantCreate", {"email": "a@b.c"}))
    assert made.status_code == 201, made.get_json()
    leak_watch.add(made.get_json()["api_key"])
    leak_watch.add(made.get_json()["signing_secret"])
