"""POST /v1/intent/verify: every block reason, tampering, signatures, hash errors."""
import json
from pathlib import Path

import pytest
import time_machine
from sqlalchemy import func, select

from app.extensions import db
from app.intents.signature import matches, signing_message, sign as server_sign
from app.tenants.models import DailyUsage, MonthlyUsage
from app.tenants import service as tenant_service
from app.sql import unit_of_work
from tests.support import assert_envelope, scale_response, sign

VECTORS = json.loads((Path(__file__).parent / "vectors" / "signatures.json").read_text())["vectors"]
T0 = 1_800_000_000


def _generate(client, credentials, ttl=3600):
    response = client.post("/v1/intent/generate", headers=credentials.headers,
                           json={"user_token": "verify-user-token", "ttl": ttl})
    assert response.status_code == 200, response.get_json()
    return response.get_json()["intent_hash"]


def _verify(client, credentials, intent_hash, response, headers=None):
    return client.post("/v1/intent/verify", headers={**credentials.headers, **(headers or {})},
                       json={"original_intent_hash": intent_hash, "response": response})


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: f"{v['scheme']}-{v['match_id']}")
def test_signature_vectors(vector):
    from app.intents.signature import canonical_json

    message = signing_message(vector["scheme"], vector["intent_hash"], vector["match_id"],
                              vector["timestamp"], canonical_json(vector["payload"]))
    assert message.decode("utf-8") == vector["message"]
    assert server_sign(vector["secret"], message) == vector["signature"]
    assert matches([vector["secret"]], message, vector["signature"].upper())


def test_cleared_response_returns_the_payload(client, tenant):
    intent_hash = _generate(client, tenant)
    payload = {"answer": "Paris", "sources": [{"n": 1}], "confidence": 0.97}
    response = _verify(client, tenant, intent_hash, scale_response(tenant.signing_secret, intent_hash,
                                                                   payload))
    assert response.status_code == 200
    assert response.get_json() == {"cleared": True, "reason": None, "payload": payload}


def _case_unknown(client, tenant, make_tenant):
    intent_hash = "sha256:" + "c" * 64
    return intent_hash, scale_response(tenant.signing_secret, intent_hash)


def _case_other_tenant(client, tenant, make_tenant):
    other = make_tenant("pro")
    intent_hash = _generate(client, other)
    return intent_hash, scale_response(tenant.signing_secret, intent_hash)


def _case_replayed_intent(client, tenant, make_tenant):
    intent_hash = _generate(client, tenant)
    assert _verify(client, tenant, intent_hash,
                   scale_response(tenant.signing_secret, intent_hash)).get_json()["cleared"]
    return intent_hash, scale_response(tenant.signing_secret, intent_hash)


def _case_bad_signature(client, tenant, make_tenant):
    intent_hash = _generate(client, tenant)
    return intent_hash, scale_response(tenant.signing_secret, intent_hash, signature="0" * 64)


def _case_future_timestamp(client, tenant, make_tenant):
    intent_hash = _generate(client, tenant)
    return intent_hash, scale_response(tenant.signing_secret, intent_hash, timestamp=T0 + 61)


def _case_before_issue(client, tenant, make_tenant):
    intent_hash = _generate(client, tenant)
    return intent_hash, scale_response(tenant.signing_secret, intent_hash, timestamp=T0 - 61)


def _case_replayed_response(client, tenant, make_tenant):
    first, second = _generate(client, tenant), _generate(client, tenant)
    assert _verify(client, tenant, first, scale_response(tenant.signing_secret, first,
                                                         match_id="dup-1")).get_json()["cleared"]
    return second, scale_response(tenant.signing_secret, second, match_id="dup-1")


def _case_cleared_at_skew_edge(client, tenant, make_tenant):
    intent_hash = _generate(client, tenant)
    return intent_hash, scale_response(tenant.signing_secret, intent_hash, timestamp=T0 + 60)


@pytest.mark.parametrize("build, reason", [
    (_case_unknown, "UnknownIntent"),
    (_case_other_tenant, "UnknownIntent"),
    (_case_replayed_intent, "ReplayedIntent"),
    (_case_bad_signature, "InvalidSignature"),
    (_case_future_timestamp, "TimestampOutOfWindow"),
    (_case_before_issue, "TimestampOutOfWindow"),
    (_case_replayed_response, "ReplayedResponse"),
    (_case_cleared_at_skew_edge, None),
])
def test_block_reasons(client, tenant, make_tenant, build, reason):
    with time_machine.travel(T0, tick=False):
        intent_hash, response = build(client, tenant, make_tenant)
        verdict = _verify(client, tenant, intent_hash, response)
    assert verdict.status_code == 200
    expected = {"cleared": reason is None, "reason": reason,
                "payload": response["payload"] if reason is None else None}
    assert verdict.get_json() == expected


def test_expired_intent(client, tenant):
    with time_machine.travel(T0, tick=False):
        intent_hash = _generate(client, tenant, ttl=5)
    with time_machine.travel(T0 + 6, tick=False):
        response = scale_response(tenant.signing_secret, intent_hash)
        assert _verify(client, tenant, intent_hash, response).get_json() == {
            "cleared": False, "reason": "ExpiredIntent", "payload": None}
        # expired beats replayed: the second try is still ExpiredIntent
        assert _verify(client, tenant, intent_hash, response).get_json()["reason"] == "ExpiredIntent"
    with time_machine.travel(T0 + 5, tick=False):
        fresh = _generate(client, tenant, ttl=5)
    with time_machine.travel(T0 + 9.999, tick=False):
        assert _verify(client, tenant, fresh, scale_response(tenant.signing_secret, fresh)
                       ).get_json()["cleared"] is True


@pytest.mark.parametrize("issued_within_its_second", [0.0, 0.9])
def test_an_intent_is_expired_once_the_time_is_past_its_expires_at(
        client, tenant, issued_within_its_second):
    """expires_at is the second of issue plus the ttl, and the gate's now is whole seconds: the
    intent clears until expires_at and is expired from then on. Before, it cleared up to a
    second after its expires_at (now > expires_at)."""
    issued = T0 + issued_within_its_second
    with time_machine.travel(issued, tick=False):
        answer = client.post("/v1/intent/generate", headers=tenant.headers,
                             json={"user_token": "verify-user-token", "ttl": 2}).get_json()
        late = _generate(client, tenant, ttl=2)
    assert answer["expires_at"] == T0 + 2
    with time_machine.travel(T0 + 1.999, tick=False):
        assert _verify(client, tenant, answer["intent_hash"],
                       scale_response(tenant.signing_secret, answer["intent_hash"])
                       ).get_json()["cleared"] is True
    with time_machine.travel(T0 + 2.6, tick=False):
        assert _verify(client, tenant, late, scale_response(tenant.signing_secret, late)
                       ).get_json()["reason"] == "ExpiredIntent"


def test_a_blocked_verify_still_consumes_the_intent(client, tenant):
    intent_hash = _generate(client, tenant)
    bad = scale_response(tenant.signing_secret, intent_hash, signature="f" * 64)
    assert _verify(client, tenant, intent_hash, bad).get_json()["reason"] == "InvalidSignature"
    good = scale_response(tenant.signing_secret, intent_hash)
    assert _verify(client, tenant, intent_hash, good).get_json()["reason"] == "ReplayedIntent"


def _tamper_value(r):
    r["payload"]["answer"] = "43"


def _tamper_added_key(r):
    r["payload"]["extra"] = True


def _tamper_match_id(r):
    r["match_id"] = r["match_id"] + "x"


def _tamper_timestamp(r):
    r["timestamp"] += 1


@pytest.mark.parametrize("tamper", [_tamper_value, _tamper_added_key, _tamper_match_id,
                                    _tamper_timestamp])
def test_tampering_is_an_invalid_signature(client, tenant, tamper):
    intent_hash = _generate(client, tenant)
    response = scale_response(tenant.signing_secret, intent_hash, {"answer": "42", "n": [1, 2]})
    tamper(response)
    assert _verify(client, tenant, intent_hash, response).get_json()["reason"] == "InvalidSignature"


def test_a_signature_for_another_intent_is_invalid(client, tenant):
    first, second = _generate(client, tenant), _generate(client, tenant)
    response = scale_response(tenant.signing_secret, first)
    assert _verify(client, tenant, second, response).get_json()["reason"] == "InvalidSignature"


def test_another_tenants_secret_is_invalid(client, tenant, make_tenant):
    other = make_tenant("pro")
    intent_hash = _generate(client, tenant)
    response = scale_response(other.signing_secret, intent_hash)
    assert _verify(client, tenant, intent_hash, response).get_json()["reason"] == "InvalidSignature"


def test_key_order_and_whitespace_do_not_matter(client, tenant):
    intent_hash = _generate(client, tenant)
    response = scale_response(tenant.signing_secret, intent_hash,
                              {"b": [1, {"y": 2, "x": 1}], "a": "é"})
    body = ('{"response": {"signature": "%s", "timestamp": %d, "payload": {"a" : "\\u00e9",\n'
            '  "b": [1, {"x": 1, "y": 2.0}]}, "match_id": "%s"}, "original_intent_hash": "%s"}'
            % (response["signature"].upper(), response["timestamp"], response["match_id"],
               intent_hash.upper().replace("SHA256:", "sha256:")))
    verdict = client.post("/v1/intent/verify", headers=tenant.headers, data=body,
                          content_type="application/json")
    assert verdict.get_json()["cleared"] is True


def test_non_finite_numbers_are_refused(client, tenant):
    response = client.post("/v1/intent/verify", headers=tenant.headers, content_type="application/json",
                           data='{"original_intent_hash": "sha256:%s", "response": {"match_id": "m", '
                                '"payload": {"n": 1e999}, "timestamp": 1, "signature": "00"}}' % ("a" * 64))
    assert_envelope(response, 400,
                    "response.payload cannot be canonicalized (RFC 8785): numbers must be finite")


def test_payload_scheme(client, tenant):
    with client.application.app_context(), unit_of_work():
        tenant_service.update_tenant(tenant.tenant_id, signature_scheme="payload")
    intent_hash = _generate(client, tenant)
    payload = {"answer": "only the payload is signed"}
    response = scale_response(tenant.signing_secret, intent_hash, payload,
                              signature=sign(tenant.signing_secret, "", "", 0, payload, "payload"))
    assert _verify(client, tenant, intent_hash, response).get_json()["cleared"] is True
    bound = _generate(client, tenant)
    assert _verify(client, tenant, bound, scale_response(tenant.signing_secret, bound)
                   ).get_json()["reason"] == "InvalidSignature"


def test_previous_secret_verifies_during_the_grace_only(client, tenant):
    with time_machine.travel(T0, tick=False):
        with client.application.app_context(), unit_of_work():
            new_secret, _ = tenant_service.rotate_signing_secret(tenant.tenant_id,
                                                                 grace_seconds=600)
        for secret in (tenant.signing_secret, new_secret):
            intent_hash = _generate(client, tenant)
            assert _verify(client, tenant, intent_hash, scale_response(secret, intent_hash)
                           ).get_json()["cleared"] is True
        late = _generate(client, tenant, ttl=3600)
    with time_machine.travel(T0 + 601, tick=False):
        response = scale_response(tenant.signing_secret, late, timestamp=T0 + 601)
        assert _verify(client, tenant, late, response).get_json()["reason"] == "InvalidSignature"


def test_rotation_without_grace_drops_the_old_secret(client, tenant):
    with client.application.app_context(), unit_of_work():
        tenant_service.rotate_signing_secret(tenant.tenant_id)
    intent_hash = _generate(client, tenant)
    response = scale_response(tenant.signing_secret, intent_hash)
    assert _verify(client, tenant, intent_hash, response).get_json()["reason"] == "InvalidSignature"


def test_admin_keys_verify_with_their_own_secret(client, runner):
    issued = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "svc", "--json"]).stdout)
    headers = {"X-Service-Key": issued["api_key"]}
    intent_hash = client.post("/v1/intent/generate", headers=headers,
                              json={"user_token": "admin-user-token"}).get_json()["intent_hash"]
    response = scale_response(issued["signing_secret"], intent_hash)
    verdict = client.post("/v1/intent/verify", headers=headers,
                          json={"original_intent_hash": intent_hash, "response": response})
    assert verdict.get_json()["cleared"] is True


def test_an_admin_keys_verify_is_judged_as_a_tenants_but_never_counted(app, client, runner):
    """An admin key's verify runs the same gate (on PostgreSQL, the same function with no
    tenant): single use and the replay checks hold, and no usage row is written."""
    issued = json.loads(runner.invoke(args=["admin-keys", "create", "--name", "svc", "--json"]).stdout)
    headers, secret = {"X-Service-Key": issued["api_key"]}, issued["signing_secret"]

    def verify(intent_hash, response):
        answer = client.post("/v1/intent/verify", headers=headers,
                             json={"original_intent_hash": intent_hash, "response": response})
        assert answer.status_code == 200, answer.get_json()
        return answer.get_json()["reason"]

    first, second = (client.post("/v1/intent/generate", headers=headers,
                                 json={"user_token": "admin-user-token"}).get_json()["intent_hash"]
                     for _ in range(2))
    response = scale_response(secret, first, match_id="admin-match")
    assert verify(first, response) is None
    assert verify(first, response) == "ReplayedIntent"
    assert verify(second, scale_response(secret, second, match_id="admin-match")) == \
        "ReplayedResponse"
    assert verify("sha256:" + "0" * 64, scale_response(secret, first)) == "UnknownIntent"
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(MonthlyUsage)).scalar() == 0
        assert db.session.execute(select(func.count()).select_from(DailyUsage)).scalar() == 0


GOOD = {"match_id": "m", "payload": {}, "timestamp": 1, "signature": "00"}


@pytest.mark.parametrize("body, error", [
    ({"original_intent_hash": "md5:" + "a" * 64, "response": GOOD}, "intent hash must start with 'sha256:'"),
    ({"original_intent_hash": "a" * 64, "response": GOOD}, "intent hash must start with 'sha256:'"),
    ({"original_intent_hash": "sha256:" + "a" * 63, "response": GOOD}, "intent hash has invalid length"),
    ({"original_intent_hash": "sha256:" + "a" * 65, "response": GOOD}, "intent hash has invalid length"),
    ({"original_intent_hash": "sha256:" + "g" * 64, "response": GOOD}, "intent hash has invalid length"),
    ({"original_intent_hash": "sha256:", "response": GOOD}, "intent hash has invalid length"),
    ({"response": GOOD}, "original_intent_hash is required"),
    ({"original_intent_hash": 7, "response": GOOD}, "original_intent_hash must be a string"),
    ({"original_intent_hash": "sha256:" + "a" * 64}, "response is required"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": [GOOD]}, "response must be a JSON object"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "match_id": ""}},
     "response.match_id must be 1 to 256 characters"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "match_id": "m" * 257}},
     "response.match_id must be 1 to 256 characters"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "payload": "text"}},
     "response.payload must be a JSON object"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "timestamp": "1"}},
     "response.timestamp must be an integer (Unix seconds)"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "timestamp": 1.5}},
     "response.timestamp must be an integer (Unix seconds)"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "signature": None}},
     "response.signature is required"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": {**GOOD, "extra": 1}},
     "unknown field: response.extra"),
    ({"original_intent_hash": "sha256:" + "a" * 64, "response": GOOD, "x": 1}, "unknown field: x"),
])
def test_bad_verify_requests(client, tenant, body, error):
    response = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
    assert_envelope(response, 400, error)
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert usage["usage_count"] == 0


def test_a_verify_body_wrong_in_several_fields_names_each_the_first_in_the_error(client, tenant):
    """Fields are judged in the order the body's schema declares them, the hash's own checks
    included: the error text is the first field's, the details name every field at fault."""
    body = {"original_intent_hash": "md5:" + "a" * 64,
            "response": {**GOOD, "match_id": "m" * 257, "timestamp": "1"}}
    response = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
    assert_envelope(response, 400, "intent hash must start with 'sha256:'")
    assert response.get_json()["details"] == {
        "original_intent_hash": ["intent hash must start with 'sha256:'"],
        "response.match_id": ["response.match_id must be 1 to 256 characters"],
        "response.timestamp": ["response.timestamp must be an integer (Unix seconds)"],
    }


@pytest.mark.parametrize("headers", [{}, {"X-Service-Key": "key_live_" + "2" * 48}])
def test_verify_without_a_valid_key_is_401(client, headers):
    response = client.post("/v1/intent/verify", headers=headers,
                           json={"original_intent_hash": "sha256:" + "a" * 64, "response": GOOD})
    assert_envelope(response, 401, "invalid or missing X-Service-Key")
