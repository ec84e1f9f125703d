"""A verify whose rows another transaction holds gives up within the request budget: a 503 that
leaves nothing written, so the same request succeeds once the lock is gone."""
import pytest
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from tests.conftest import TEST_DATABASE_URL
from tests.support import assert_envelope, scale_response

pytestmark = pytest.mark.skipif(not TEST_DATABASE_URL, reason="row locks are PostgreSQL's")


def _verify_body(client, tenant):
    intent_hash = client.post("/v1/intent/generate", headers=tenant.headers,
                              json={"user_token": "lock-wait-token"}).get_json()["intent_hash"]
    return {"original_intent_hash": intent_hash,
            "response": scale_response(tenant.signing_secret, intent_hash)}


def test_a_verify_behind_a_held_usage_row_is_a_503_and_changes_nothing(client, tenant):
    first = client.post("/v1/intent/verify", headers=tenant.headers,
                        json=_verify_body(client, tenant))
    assert first.get_json()["cleared"] is True  # the month's usage row exists from here on
    body = _verify_body(client, tenant)
    # An operator's transaction holding the month's usage row (a plan change left open, say).
    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    try:
        with engine.connect() as holder:
            holder.execute(text("SELECT usage_count FROM monthly_usage WHERE tenant_id = :id"
                                " FOR UPDATE"), {"id": tenant.tenant_id})
            waited = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
            holder.rollback()
    finally:
        engine.dispose()
    assert_envelope(waited, 503, "service temporarily unavailable")
    assert waited.headers["Retry-After"] == "1"
    # Nothing was consumed or counted: the same request clears now, and the month shows two.
    again = client.post("/v1/intent/verify", headers=tenant.headers, json=body)
    assert again.status_code == 200 and again.get_json()["cleared"] is True
    usage = client.get("/v1/tenant/usage", headers=tenant.headers).get_json()
    assert usage["usage_count"] == 2
