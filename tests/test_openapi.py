"""The OpenAPI document describes the API, and the API keeps to it under generated input."""
import json
import os
import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from app.intents.reasons import BLOCK_REASONS


def test_the_document_covers_every_endpoint_and_reason(client):
    document = client.get("/openapi.json").get_json()
    assert document["openapi"].startswith("3.")
    operations = {(path, method) for path, item in document["paths"].items() for method in item}
    assert operations == {
        ("/health", "get"), ("/v1/intent/generate", "post"), ("/v1/intent/verify", "post"),
        ("/v1/tenant/usage", "get"), ("/v1/tenant/rotate-key", "post"),
        ("/v1/admin/tenants", "post"), ("/v1/admin/tenants", "get"),
        ("/v1/admin/tenants/{tenant_id}", "get"), ("/v1/admin/tenants/{tenant_id}", "patch")}
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
    assert len(operations) == 9
    for operation in operations:
        key = keys["admin"] if operation.path.startswith("/v1/admin") else keys["tenant"]

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, database=None,
                  derandomize=os.environ.get("CI") == "true",  # fixed draws in CI
                  suppress_health_check=list(HealthCheck))
        def exercise(case):
            if case.headers and "Idempotency-Key" in case.headers:
                # A key reused with another body is a documented 422; each case is a new request.
                case.headers["Idempotency-Key"] = uuid.uuid4().hex
            case.call_and_validate(headers={"X-Service-Key": key})

        exercise()
