"""Bad input never gives a 5xx or loses the envelope; the leak watch really catches leaks."""
import json
import os
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12),
                                                                       children, max_size=4),
    max_leaves=20,
)
generate_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"user_token": json_values}, optional={"ttl": json_values}),
    st.fixed_dictionaries({"user_token": st.text(max_size=5000)},
                          optional={"ttl": st.integers(-10**20, 10**20)}),
)
scale_responses = st.fixed_dictionaries(
    {}, optional={"match_id": json_values | st.text(max_size=300), "payload": json_values,
                  "timestamp": json_values | st.integers(-10**25, 10**25),
                  "signature": json_values | st.text(max_size=80)})
verify_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={
        "original_intent_hash": json_values | st.text(max_size=90)
        | st.from_regex(r"\Asha256:[0-9a-fA-F]{60,68}\Z"),
        "response": scale_responses | json_values}),
)
# Random exploration on developer machines; a fixed sequence in CI, so a landing never depends
# on the draw (a failure found locally is fixed, not re-rolled).
PROPERTY = settings(max_examples=150, deadline=None, database=None,
                    derandomize=os.environ.get("CI") == "true",
                    suppress_health_check=list(HealthCheck))


def _assert_answered(response):
    assert response.status_code < 500, response.get_data(as_text=True)
    body = response.get_json()
    assert isinstance(body, dict)
    if response.status_code >= 400:
        assert isinstance(body["error"], str) and body["error"]
        assert body["request_id"] == response.headers["X-Request-Id"]


@pytest.fixture
def roomy(app, tenant, leak_watch):
    app.config.update(RATE_LIMIT_CAPACITY=1_000_000)
    leak_watch.watch_requests = False  # generated input; the tenant's real key stays watched
    return tenant


def test_generate_survives_arbitrary_json(client, roomy):
    @PROPERTY
    @given(body=generate_bodies)
    def check(body):
        _assert_answered(client.post("/v1/intent/generate", headers=roomy.headers,
                                     data=json.dumps(body), content_type="application/json"))

    check()


def test_verify_survives_arbitrary_json(client, roomy):
    @PROPERTY
    @given(body=verify_bodies)
    def check(body):
        _assert_answered(client.post("/v1/intent/verify", headers=roomy.headers,
                                     data=json.dumps(body), content_type="application/json"))

    check()


def test_arbitrary_text_bodies_and_headers(client, roomy):
    @PROPERTY
    @given(raw=st.binary(max_size=300), path=st.sampled_from(["/v1/intent/generate",
                                                              "/v1/intent/verify"]),
           key=st.one_of(st.just(roomy.api_key), st.text(max_size=70).filter(str.isascii)),
           idempotency=st.one_of(st.none(), st.text(max_size=300).filter(str.isascii)))
    def check(raw, path, key, idempotency):
        headers = {"X-Service-Key": key} if key and "\n" not in key and "\r" not in key else {}
        if idempotency is not None and "\n" not in idempotency and "\r" not in idempotency:
            headers["Idempotency-Key"] = idempotency
        _assert_answered(client.post(path, headers=headers, data=raw,
                                     content_type="application/json"))

    check()


@pytest.mark.parametrize("path", ["/v1/intent/generate", "/v1/intent/verify",
                                  "/v1/tenant/rotate-key"])
def test_oversized_bodies_are_413_everywhere(client, tenant, path):
    body = json.dumps({"user_token": "x" * (70 * 1024)})
    response = client.post(path, headers=tenant.headers, data=body, content_type="application/json")
    assert response.status_code == 413
    assert response.get_json()["error"] == "request body too large (limit 64 KiB)"


def test_the_leak_watch_catches_a_logged_key(app, leak_watch, tenant, client):
    client.get("/v1/tenant/usage", headers=tenant.headers)
    logging.getLogger("app.careless").warning("debugging with key %s", tenant.api_key)
    assert leak_watch.leaks_in(leak_watch.buffer.getvalue()) == [tenant.api_key[:12] + "..."]
    leak_watch.buffer.truncate(0)
    leak_watch.buffer.seek(0)
