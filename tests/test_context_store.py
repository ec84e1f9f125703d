"""The context store as a real external HTTP dependency (pytest-httpserver)."""
import json
import time

import pytest
from sqlalchemy import func, select
from werkzeug import Response

from app.extensions import db
from app.intents.models import Intent
from tests.servers import free_port
from tests.support import assert_envelope

TOKEN = "eyJhbGciOiJIUzI1NiJ9.ctx-token.signature-part"


@pytest.fixture
def store_url(httpserver, app):
    app.config["CONTEXT_STORE_URL"] = httpserver.url_for("/context")
    app.config["CONTEXT_STORE_READ_TIMEOUT"] = 0.5
    return app.config["CONTEXT_STORE_URL"]


def _generate(client, tenant):
    return client.post("/v1/intent/generate", headers=tenant.headers, json={"user_token": TOKEN})


def _no_intent_written():
    return db.session.execute(select(func.count()).select_from(Intent)).scalar_one() == 0


@pytest.mark.parametrize("tags, intent_class", [
    (["checkout", "cart"], "commerce"),
    (["kubernetes-cluster"], "infrastructure"),
    (["yoga", "sleep"], "wellness"),
    (["mortgage"], "finance"),
    (["homework"], "education"),
    (["friends-feed"], "social"),
    (["weather"], "other"),
    ([], "other"),
])
def test_tags_from_the_store_choose_the_class(client, tenant, httpserver, store_url, tags,
                                              intent_class):
    httpserver.expect_request(
        "/context", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
    ).respond_with_json({"tags": tags})
    response = _generate(client, tenant)
    assert response.status_code == 200
    assert response.get_json()["intent_class"] == intent_class
    (request, _), = httpserver.log
    assert TOKEN not in request.url and request.get_json() == {}


def _failing(httpserver, **respond):
    httpserver.expect_request("/context").respond_with_response(Response(**respond))


@pytest.mark.parametrize("respond, failure", [
    ({"response": "boom", "status": 500}, "status 500"),
    ({"response": "missing", "status": 404}, "status 404"),
    ({"response": "<html>hi</html>", "status": 200, "content_type": "text/html"}, "answer is not JSON"),
    ({"response": json.dumps({"labels": ["x"]}), "status": 200,
      "content_type": "application/json"}, "answer has no list of tags"),
    ({"response": json.dumps(["x"]), "status": 200,
      "content_type": "application/json"}, "answer has no list of tags"),
    ({"response": json.dumps({"tags": [1, 2]}), "status": 200,
      "content_type": "application/json"}, "answer has a tag that is not a short string"),
])
def test_store_failures_are_502_and_write_nothing(client, tenant, httpserver, store_url, caplog,
                                                  respond, failure):
    _failing(httpserver, **respond)
    response = _generate(client, tenant)
    assert_envelope(response, 502, "context store request failed")
    assert _no_intent_written()
    records = [r for r in caplog.records if r.getMessage() == "context store request failed"]
    assert records and records[-1].failure == failure
    assert TOKEN not in caplog.text


def test_read_timeout_is_502(client, tenant, httpserver, store_url, caplog):
    def slow(request):
        time.sleep(1.2)
        return Response(json.dumps({"tags": []}), content_type="application/json")

    httpserver.expect_request("/context").respond_with_handler(slow)
    started = time.monotonic()
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert time.monotonic() - started < 1.1
    assert _no_intent_written()
    assert [r.failure for r in caplog.records if hasattr(r, "failure")][-1] == "read timeout"


def test_refused_connection_is_502(client, tenant, app, caplog):
    app.config["CONTEXT_STORE_URL"] = f"http://127.0.0.1:{free_port()}/context"
    assert_envelope(_generate(client, tenant), 502, "context store request failed")
    assert _no_intent_written()
    assert [r.failure for r in caplog.records if hasattr(r, "failure")][-1] == "connection failed"
