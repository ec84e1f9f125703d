"""Principals kept in Redis (app.tenants.key_cache): generate and verify act on one only while
the database confirms it, in the statement that writes, so every change to a key or its tenant
counts from the moment it commits, as it does without the cache."""
import hashlib
import json

import pytest
import redis
import time_machine
from cryptography.fernet import Fernet
from sqlalchemy import text

from app.clock import billing_period
from app.extensions import db
from app.sql import unit_of_work
from app.tenants import key_cache, keys, service as tenant_service
from app.tenants.models import MonthlyUsage
from app.tenants.plans import monthly_limit
from tests.conftest import TEST_DATABASE_URL, TEST_REDIS_URL
from tests.support import assert_envelope, scale_response
from tests.test_signing_keys import KeyPair

pytestmark = pytest.mark.skipif(
    not (TEST_DATABASE_URL and TEST_REDIS_URL),
    reason="principals are kept where PostgreSQL confirms them and Redis is the limiter's store")

INVALID_KEY = "invalid or missing X-Service-Key"


def _generate(client, tenant, headers=None):
    return client.post("/v1/intent/generate", headers=headers or tenant.headers,
                       json={"user_token": "kept-principal-user-token"})


def _intent(client, tenant):
    response = _generate(client, tenant)
    assert response.status_code == 200, response.get_json()
    return response.get_json()["intent_hash"]


def _verify(client, tenant, intent_hash, response, headers=None):
    return client.post("/v1/intent/verify", headers={**tenant.headers, **(headers or {})},
                       json={"original_intent_hash": intent_hash, "response": response})


def _entry_name(tenant):
    return key_cache.PREFIX + hashlib.sha256(tenant.api_key.encode()).hexdigest()


def _kept(tenant):
    return redis.Redis.from_url(TEST_REDIS_URL).get(_entry_name(tenant))


def _keep_altered(client, tenant, **fields):
    """Replace the kept principal by one with `fields` changed, sealed as the service seals."""
    text = _kept(tenant).partition(b" ")[2]
    altered = json.dumps({**json.loads(text), **fields}, separators=(",", ":")).encode()
    digest = hashlib.sha256(tenant.api_key.encode()).hexdigest()
    with client.application.app_context():
        sealed = key_cache._sealed(digest, altered)
    redis.Redis.from_url(TEST_REDIS_URL).set(_entry_name(tenant), sealed)


def _revoke_default_key(client, tenant):
    """Revoke the tenant's first key, and put back the principal kept for it before: as a
    request that read the key just before the revocation would keep it, or as it stays when
    Redis did not answer the revocation's forgetting. The write must refuse it."""
    kept = _kept(tenant)
    with client.application.app_context(), unit_of_work():
        keys.create_key(tenant.tenant_id, name="next")
        (key_id,) = [row.id for row in keys.list_keys(tenant.tenant_id) if row.name == "default"]
        keys.revoke_key(tenant.tenant_id, key_id)
    assert _kept(tenant) is None  # forgotten when the revocation committed
    redis.Redis.from_url(TEST_REDIS_URL).set(_entry_name(tenant), kept)


@pytest.fixture
def kept(client, make_tenant):
    """A tenant (on an unlimited plan, the only one kept) whose principal the first generate
    kept."""
    tenant = make_tenant("enterprise")
    assert _kept(tenant) is None
    _intent(client, tenant)
    assert _kept(tenant) is not None
    return tenant


def test_a_kept_principal_generates_and_verifies(client, kept):
    intent_hash = _intent(client, kept)
    cleared = _verify(client, kept, intent_hash, scale_response(kept.signing_secret, intent_hash))
    assert cleared.get_json()["cleared"] is True
    assert client.get("/v1/tenant/usage", headers=kept.headers).get_json()["usage_count"] == 1
    text = _kept(kept).decode()
    assert kept.api_key not in text and kept.signing_secret not in text  # digest and sealed only
    assert "usage_count" not in text


def test_a_principal_that_no_longer_matches_is_never_acted_on(client, kept):
    """A kept principal naming another plan and scheme: the write refuses it, nothing of it is
    used, and the request is answered from a fresh lookup, which replaces what was kept."""
    genuine = json.loads(_kept(kept).partition(b" ")[2])
    _keep_altered(client, kept, plan="pro" if genuine["plan"] != "pro" else "free",
                  fingerprint="0" * 32)
    intent_hash = _intent(client, kept)
    assert json.loads(_kept(kept).partition(b" ")[2]) == genuine
    _keep_altered(client, kept, signature_scheme="payload", fingerprint="0" * 32)
    answer = _verify(client, kept, intent_hash, scale_response(kept.signing_secret, intent_hash))
    assert answer.get_json()["cleared"] is True  # judged under the bound scheme, as stored
    assert json.loads(_kept(kept).partition(b" ")[2]) == genuine


def test_a_tampered_entry_is_ignored(client, kept, make_tenant):
    """Whoever writes to Redis cannot make the service trust a principal it did not read:
    an entry without the service's seal, or sealed for another key, is not used."""
    entry = _kept(kept)
    mac, _, text = entry.partition(b" ")
    store = redis.Redis.from_url(TEST_REDIS_URL)
    store.set(_entry_name(kept), b"0" * len(mac) + b" " + text)
    assert _generate(client, kept).status_code == 200
    other = make_tenant("enterprise")
    _intent(client, other)
    store.set(_entry_name(kept), _kept(other))  # another key's genuine entry, moved
    intent_hash = _intent(client, kept)
    answer = _verify(client, kept, intent_hash, scale_response(kept.signing_secret, intent_hash))
    assert answer.get_json()["cleared"] is True
    assert _kept(kept) == entry


def test_a_revoked_key_is_refused_at_once(client, kept):
    intent_hash = _intent(client, kept)
    _revoke_default_key(client, kept)
    assert _kept(kept) is not None
    assert_envelope(_generate(client, kept), 401, INVALID_KEY)
    assert _kept(kept) is None  # forgotten: the next request fails authentication as usual
    assert_envelope(_verify(client, kept, intent_hash,
                            scale_response(kept.signing_secret, intent_hash)), 401, INVALID_KEY)


def test_a_revoked_key_reads_no_stored_verdict(client, kept):
    """A retried verify is answered from its stored verdict before the gate runs: a kept
    principal is confirmed first."""
    intent_hash = _intent(client, kept)
    retry = {"Idempotency-Key": "kept-principal-retry"}
    signed = scale_response(kept.signing_secret, intent_hash)
    assert _verify(client, kept, intent_hash, signed, retry).get_json()["cleared"] is True
    _intent(client, kept)  # kept again
    _revoke_default_key(client, kept)
    assert _kept(kept) is not None
    assert_envelope(_verify(client, kept, intent_hash, signed, retry), 401, INVALID_KEY)


def test_a_deactivated_tenant_is_refused_at_once(client, kept):
    intent_hash = _intent(client, kept)
    entry = _kept(kept)
    with client.application.app_context(), unit_of_work():
        tenant_service.update_tenant(kept.tenant_id, active=False)
    assert _kept(kept) is None  # forgotten when the change committed; put back, it is refused
    redis.Redis.from_url(TEST_REDIS_URL).set(_entry_name(kept), entry)
    assert_envelope(_verify(client, kept, intent_hash,
                            scale_response(kept.signing_secret, intent_hash)), 401, INVALID_KEY)
    assert_envelope(_generate(client, kept), 401, INVALID_KEY)
    with client.application.app_context(), unit_of_work():
        tenant_service.update_tenant(kept.tenant_id, active=True)
    assert _generate(client, kept).status_code == 200


def test_a_change_made_outside_the_service_counts_at_once(client, kept):
    """An operator's SQL deactivating the tenant forgets nothing in Redis: the kept principal is
    refused by the write all the same (the trigger moved the row's credentials_version on), in
    the very next verify and generate, and a change back counts at once too."""
    intent_hash = _intent(client, kept)
    entry = _kept(kept)

    def operator_sets_active(active):
        with client.application.app_context(), unit_of_work():
            db.session.execute(text("UPDATE tenants SET active = :active WHERE id = :id"),
                               {"active": active, "id": kept.tenant_id})

    operator_sets_active(False)
    assert _kept(kept) is not None  # nothing forgot it: the write's confirmation must refuse it
    assert_envelope(_verify(client, kept, intent_hash,
                            scale_response(kept.signing_secret, intent_hash)), 401, INVALID_KEY)
    redis.Redis.from_url(TEST_REDIS_URL).set(_entry_name(kept), entry)  # the 401 forgot it
    assert_envelope(_generate(client, kept), 401, INVALID_KEY)
    operator_sets_active(True)
    assert _generate(client, kept).status_code == 200


def test_a_rotated_signing_secret_counts_at_once(client, kept):
    intent_hash = _intent(client, kept)
    with client.application.app_context(), unit_of_work():
        new_secret, _ = tenant_service.rotate_signing_secret(kept.tenant_id, grace_seconds=0)
    old = _verify(client, kept, intent_hash, scale_response(kept.signing_secret, intent_hash))
    assert old.get_json()["reason"] == "InvalidSignature"
    intent_hash = _intent(client, kept)
    new = _verify(client, kept, intent_hash, scale_response(new_secret, intent_hash))
    assert new.get_json()["cleared"] is True


def test_a_kept_secret_no_key_unseals_is_decided_by_a_fresh_lookup(client, kept, caplog):
    """A kept copy sealed under a key the ring no longer holds (a reseal retired it, say) is
    not the database's word: the verify is judged on a fresh lookup, and nothing is logged as
    unsealable, which only the database's own copy could be."""
    from cryptography.fernet import Fernet

    _keep_altered(client, kept, signing_secret_sealed=Fernet(Fernet.generate_key()).encrypt(
        b"sig_live_" + b"c" * 64).decode())
    intent_hash = _intent(client, kept)
    caplog.clear()
    answer = _verify(client, kept, intent_hash, scale_response(kept.signing_secret, intent_hash))
    assert answer.get_json()["cleared"] is True
    assert not [record for record in caplog.records if "unsealed" in record.getMessage()]


def test_a_revoked_signing_key_counts_at_once(client, kept, admin_headers):
    pairs = [KeyPair(), KeyPair()]
    added = [client.post(f"/v1/admin/tenants/{kept.tenant_id}/signing-keys",
                         headers=admin_headers, json={"public_key": pair.raw_base64})
             for pair in pairs]
    assert [response.status_code for response in added] == [201, 201]
    with client.application.app_context(), unit_of_work():
        tenant_service.update_tenant(kept.tenant_id, signature_scheme="ed25519")
    intent_hash = _intent(client, kept)
    assert _verify(client, kept, intent_hash, pairs[0].response(intent_hash)).get_json()["cleared"]
    revoked = client.delete(f"/v1/admin/tenants/{kept.tenant_id}/signing-keys/"
                            f"{added[0].get_json()['id']}", headers=admin_headers)
    assert revoked.status_code == 200, revoked.get_json()
    intent_hash = _intent(client, kept)
    answer = _verify(client, kept, intent_hash, pairs[0].response(intent_hash))
    assert answer.get_json()["reason"] == "InvalidSignature"
    intent_hash = _intent(client, kept)
    assert _verify(client, kept, intent_hash, pairs[1].response(intent_hash)).get_json()["cleared"]


@pytest.mark.parametrize("plan", ["free", "starter", "pro"])
def test_a_used_up_month_sends_no_user_token_anywhere(client, make_tenant, httpserver, plan):
    """A kept principal carries no usage_count, and a generate asks the context store before
    its write: a limited plan's principal is never kept, so its lookup refuses a used-up month
    before the user's token goes out."""
    client.application.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    httpserver.expect_request("/context").respond_with_json({"tags": ["weather"]})
    tenant = make_tenant(plan)
    intent_hash = _intent(client, tenant)
    with client.application.app_context(), unit_of_work():
        db.session.add(MonthlyUsage(tenant_id=tenant.tenant_id, period=billing_period(),
                                    shard=5, usage_count=monthly_limit(plan)))
    for _ in range(2):
        assert_envelope(_generate(client, tenant), 429, "monthly verification limit reached")
    assert_envelope(_verify(client, tenant, intent_hash,
                            scale_response(tenant.signing_secret, intent_hash)),
                    429, "monthly verification limit reached")
    assert len(httpserver.log) == 1  # the refused generates' user tokens went nowhere
    assert _kept(tenant) is None


def test_a_move_to_a_limited_plan_forgets_what_was_kept(client, kept, httpserver):
    """The principal kept for an unlimited plan no longer holds: forgotten when the change
    commits, so a month the new plan finds used up refuses the next generate at once."""
    client.application.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    with client.application.app_context(), unit_of_work():
        db.session.add(MonthlyUsage(tenant_id=kept.tenant_id, period=billing_period(), shard=5,
                                    usage_count=1_000))
        tenant_service.update_tenant(kept.tenant_id, plan="free")
    assert _kept(kept) is None
    assert_envelope(_generate(client, kept), 429, "monthly verification limit reached")
    assert not httpserver.log


def test_an_entry_kept_past_a_move_to_a_limited_plan_is_forgotten_at_its_first_use(
        client, kept, httpserver):
    """A request that read the key just before the move keeps its principal just after the
    move forgot it (or Redis missed the forgetting): its first use is refused by the write and
    looked up afresh, and that lookup forgets it rather than leave it sending user tokens to
    the context store until it expires."""
    client.application.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    httpserver.expect_request("/context").respond_with_json({"tags": ["weather"]})
    entry = _kept(kept)
    with client.application.app_context(), unit_of_work():
        db.session.add(MonthlyUsage(tenant_id=kept.tenant_id, period=billing_period(), shard=5,
                                    usage_count=1_000))
        tenant_service.update_tenant(kept.tenant_id, plan="free")
    redis.Redis.from_url(TEST_REDIS_URL).set(_entry_name(kept), entry)
    for _ in range(3):
        assert_envelope(_generate(client, kept), 429, "monthly verification limit reached")
    assert len(httpserver.log) == 1 and _kept(kept) is None


def test_every_refusal_of_a_kept_principal_is_the_databases(client, kept):
    """Only a success goes through the write that confirms a kept principal: any other answer
    (a bad body, a context store failure, a refusal) is decided again on a fresh lookup, so a
    revoked key is a 401 whatever else is wrong with the request."""
    _revoke_default_key(client, kept)
    assert_envelope(client.post("/v1/intent/generate", headers=kept.headers,
                                json={"user_token": ""}), 401, INVALID_KEY)
    assert _kept(kept) is None  # forgotten: its next request fails authentication as usual


def test_a_revoked_key_with_an_empty_bucket_is_a_401(client, make_tenant):
    client.application.config.update(RATE_LIMIT_CAPACITY=2, RATE_LIMIT_REFILL_PER_MINUTE=1)
    tenant = make_tenant("enterprise")
    for _ in range(2):  # the bucket's two tokens: the principal is kept
        assert _generate(client, tenant).status_code == 200
    assert_envelope(_generate(client, tenant), 429, "rate limit exceeded")
    _revoke_default_key(client, tenant)
    assert_envelope(_generate(client, tenant), 401, INVALID_KEY)


def test_an_entry_of_another_shape_is_a_miss(client, kept):
    """An entry a release with other principal columns kept (sealed alike) is not used."""
    genuine = json.loads(_kept(kept).partition(b" ")[2])
    _keep_altered(client, kept, column_of_another_release=1)
    assert _generate(client, kept).status_code == 200
    assert json.loads(_kept(kept).partition(b" ")[2]) == genuine


@pytest.mark.parametrize("change", ["revoke", "rotate", "deactivate"])
def test_a_key_refused_by_a_change_sends_no_user_token_anywhere(client, kept, httpserver,
                                                               admin_headers, leak_watch,
                                                               change):
    """A generate asks the context store before its write confirms the principal: a key a
    committed change refuses must be refused before that, not after the user's token went out.
    The change forgets what was kept for it, so the next request looks the key up afresh."""
    client.application.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    httpserver.expect_request("/context").respond_with_json({"tags": ["weather"]})
    _intent(client, kept)
    assert len(httpserver.log) == 1 and _kept(kept) is not None
    if change == "revoke":
        keys_url = f"/v1/admin/tenants/{kept.tenant_id}/keys"
        other = client.post(keys_url, headers=admin_headers, json={"name": "next"})
        leak_watch.add(other.get_json()["api_key"])
        (mine,) = [key["id"] for key in client.get(keys_url, headers=admin_headers)
                   .get_json()["keys"] if key["name"] == "default"]
        answer = client.delete(f"{keys_url}/{mine}", headers=admin_headers)
    elif change == "rotate":
        answer = client.post("/v1/tenant/rotate-key", headers=kept.headers)
        leak_watch.add(answer.get_json()["new_key"])
    else:
        answer = client.patch(f"/v1/admin/tenants/{kept.tenant_id}", headers=admin_headers,
                              json={"active": False})
    assert answer.status_code == 200, answer.get_json()
    assert _kept(kept) is None
    assert_envelope(_generate(client, kept), 401, INVALID_KEY)
    assert len(httpserver.log) == 1  # the refused key's user token went nowhere


def test_an_expired_key_sends_no_user_token_anywhere(client, make_tenant, httpserver, leak_watch):
    """A generate asks the context store before its write confirms the principal: a key whose
    principal is kept must be refused from the second it expires, before that. Its entry lives
    no longer than the key, and one kept past the expiry is not used."""
    client.application.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    httpserver.expect_request("/context").respond_with_json({"tags": ["weather"]})
    tenant = make_tenant("enterprise")
    created = client.post("/v1/tenant/keys", headers=tenant.headers,
                          json={"name": "brief", "expires_in": 60}).get_json()
    leak_watch.add(created["api_key"])
    brief = {"X-Service-Key": created["api_key"]}
    assert _generate(client, tenant, brief).status_code == 200
    entry = key_cache.PREFIX + hashlib.sha256(created["api_key"].encode()).hexdigest()
    # 60 seconds from the exact time, rounded up to the key's second (not TTL_SECONDS).
    assert 0 < redis.Redis.from_url(TEST_REDIS_URL).ttl(entry) <= 61
    with time_machine.travel(created["expires_at"], tick=False):
        assert_envelope(_generate(client, tenant, brief), 401, INVALID_KEY)
    assert len(httpserver.log) == 1  # the expired key's user token went nowhere


def test_processes_whose_rings_a_rotation_sets_apart_share_what_they_keep(client, kept, caplog):
    """deploy/README's rotation: the new key added last everywhere, then put first. Meanwhile
    each process recognises what the others keep (the MAC is the first key's, checked under
    any), rather than take it for tampering and look every key up afresh."""
    app, entry = client.application, _kept(kept)
    ring, new = app.config["SECRET_ENCRYPTION_KEY"], Fernet.generate_key().decode()
    app.config["SECRET_ENCRYPTION_KEY"] = f"{new},{ring}"
    _intent(client, kept)
    assert _kept(kept) == entry  # recognised, not replaced by a fresh lookup's
    redis.Redis.from_url(TEST_REDIS_URL).delete(_entry_name(kept))
    _intent(client, kept)
    sealed_with_new = _kept(kept)
    assert sealed_with_new not in (None, entry)
    app.config["SECRET_ENCRYPTION_KEY"] = f"{ring},{new}"
    _intent(client, kept)
    assert _kept(kept) == sealed_with_new
    assert "integrity check" not in caplog.text
