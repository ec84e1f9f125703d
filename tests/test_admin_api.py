"""The admin HTTP API and key delivery by email over a real SMTP server (aiosmtpd)."""
import email
import json
import ssl

import pytest
import trustme
from aiosmtpd.controller import Controller

from tests.servers import free_port
from tests.support import assert_envelope


class Inbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture
def smtp_inbox(app):
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    app.config.update(SMTP_HOST="127.0.0.1", SMTP_PORT=controller.port)
    yield inbox
    controller.stop()


@pytest.fixture
def admin_headers(runner):
    result = runner.invoke(args=["admin-keys", "create", "--name", "internal", "--json"])
    return {"X-Service-Key": json.loads(result.stdout)["api_key"]}


def test_create_returns_the_key_once_and_it_works(client, admin_headers):
    response = client.post("/v1/admin/tenants", headers=admin_headers,
                           json={"email": "New@Example.com", "plan": "pro"})
    assert response.status_code == 201
    body = response.get_json()
    assert body["email"] == "new@example.com" and body["plan"] == "pro" and body["active"]
    assert body["usage"]["rate_limit"] == 500_000
    tenant_headers = {"X-Service-Key": body["api_key"]}
    assert client.get("/v1/tenant/usage", headers=tenant_headers).status_code == 200
    shown = client.get(f"/v1/admin/tenants/{body['tenant_id']}", headers=admin_headers).get_json()
    assert "api_key" not in shown and "signing_secret" not in shown
    listed = client.get(f"/v1/admin/tenants/{body['tenant_id']}/keys",
                        headers=admin_headers).get_json()["keys"]
    assert [key["prefix"] for key in listed] == [body["api_key"][:15]]


@pytest.mark.parametrize(
    "payload, error",
    [
        ({}, "email is required"),
        ({"email": "nope"}, "email is not a valid email address"),
        # format: email in the OpenAPI document: ASCII only, in the local part and the domain
        ({"email": "jörg@example.com"}, "email must contain ASCII characters only"),
        ({"email": "a@exämple.com"}, "email must contain ASCII characters only"),
        ({"email": "a@example.com", "plan": "gold"}, "plan must be one of: free, starter, pro, enterprise"),
        ({"email": "a@example.com", "colour": "red"}, "unknown field: colour"),
        ({"email": 5}, "email must be a string"),
        # A null gets the field's own text, as any other wrong value (not "Field may not be
        # null.", which names no field).
        ({"email": None}, "email must be a string"),
        ({"email": "a@example.com", "plan": None}, "plan must be one of: free, starter, pro, enterprise"),
    ],
)
def test_create_validates_the_body(client, admin_headers, payload, error):
    body = assert_envelope(client.post("/v1/admin/tenants", headers=admin_headers, json=payload),
                           400, error)
    assert body["details"]


@pytest.mark.parametrize("payload, error", [
    ({"plan": None}, "plan must be one of: free, starter, pro, enterprise"),
    ({"signature_scheme": None}, "signature_scheme must be one of: bound, payload, ed25519"),
    ({"active": None}, "active must be true or false"),
])
def test_update_names_the_field_a_null_was_sent_for(client, admin_headers, make_tenant, payload,
                                                    error):
    tenant = make_tenant()
    assert_envelope(client.patch(f"/v1/admin/tenants/{tenant.tenant_id}", headers=admin_headers,
                                 json=payload), 400, error)


def test_create_requires_json(client, admin_headers):
    response = client.post("/v1/admin/tenants", headers=admin_headers, data="email=a@b.c")
    assert_envelope(response, 400, "Content-Type must be application/json")


def test_list_and_update(client, admin_headers, make_tenant):
    first, second = make_tenant("free"), make_tenant("starter")
    listed = client.get("/v1/admin/tenants?limit=1", headers=admin_headers).get_json()
    assert [t["tenant_id"] for t in listed["tenants"]] == [first.tenant_id] and listed["has_more"]
    after = client.get(f"/v1/admin/tenants?starting_after={first.tenant_id}",
                       headers=admin_headers).get_json()
    assert [t["tenant_id"] for t in after["tenants"]] == [second.tenant_id]
    last = client.get(f"/v1/admin/tenants?limit=1&starting_after={first.tenant_id}",
                      headers=admin_headers).get_json()
    # A full last page: nothing after it.
    assert [t["tenant_id"] for t in last["tenants"]] == [second.tenant_id]
    assert last["has_more"] is False
    assert_envelope(client.get("/v1/admin/tenants?limit=0", headers=admin_headers), 400,
                    "limit must be an integer between 1 and 200")
    patched = client.patch(f"/v1/admin/tenants/{first.tenant_id}", headers=admin_headers,
                           json={"plan": "enterprise", "active": False})
    assert patched.status_code == 200
    assert patched.get_json()["plan"] == "enterprise" and patched.get_json()["active"] is False
    assert client.get("/v1/tenant/usage", headers=first.headers).status_code == 401
    assert_envelope(client.patch(f"/v1/admin/tenants/{first.tenant_id}", headers=admin_headers,
                                 json={}), 400, "give at least one of plan, active, signature_scheme")
    assert_envelope(client.get("/v1/admin/tenants/999999", headers=admin_headers), 404,
                    "tenant not found")


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, "false", "true", None, [], {}])
def test_active_is_exactly_true_or_false(client, admin_headers, tenant, value):
    response = client.patch(f"/v1/admin/tenants/{tenant.tenant_id}", headers=admin_headers,
                            json={"active": value})
    body = assert_envelope(response, 400, "active must be true or false")
    assert body["details"] == {"active": ["active must be true or false"]}
    assert client.get("/v1/tenant/usage", headers=tenant.headers).status_code == 200


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, "true", None])
def test_send_email_is_exactly_true_or_false(client, admin_headers, value):
    response = client.post("/v1/admin/tenants", headers=admin_headers,
                           json={"email": "flag@example.com", "plan": "pro", "send_email": value})
    assert_envelope(response, 400, "send_email must be true or false")
    listed = client.get("/v1/admin/tenants", headers=admin_headers).get_json()
    assert listed["tenants"] == []


def test_tenant_key_cannot_use_the_admin_api(client, tenant):
    assert_envelope(client.get("/v1/admin/tenants", headers=tenant.headers), 403,
                    "this endpoint requires an admin key")


def test_paid_plan_key_is_emailed(client, admin_headers, smtp_inbox, runner):
    response = client.post("/v1/admin/tenants", headers=admin_headers,
                           json={"email": "buyer@example.com", "plan": "starter", "send_email": True})
    body = response.get_json()
    assert body["email_sent"] is True
    (message,) = smtp_inbox.messages
    assert message["To"] == "buyer@example.com"
    assert body["api_key"] in message.get_payload()
    result = runner.invoke(args=["tenants", "create", "--email", "cli-buyer@example.com",
                                 "--plan", "pro", "--send-email"])
    assert result.exit_code == 0 and len(smtp_inbox.messages) == 2


@pytest.fixture
def starttls_inbox(app):
    """An SMTP server that takes mail only after STARTTLS, with a certificate from its own CA."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), tls_context=context,
                            require_starttls=True)
    controller.start()
    app.config.update(SMTP_HOST="127.0.0.1", SMTP_PORT=controller.port, SMTP_STARTTLS=True)
    yield inbox, ca
    controller.stop()


def test_keys_are_emailed_over_tls_only_to_a_server_whose_certificate_checks_out(
        client, admin_headers, starttls_inbox, monkeypatch, tmp_path):
    inbox, ca = starttls_inbox
    refused = client.post("/v1/admin/tenants", headers=admin_headers,
                          json={"email": "mitm@example.com", "plan": "pro", "send_email": True})
    assert refused.status_code == 201
    assert refused.get_json()["email_sent"] is False
    assert refused.get_json()["email_error"] == "email delivery failed (SSLCertVerificationError)"
    assert inbox.messages == []
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))  # the operator's CA
    trusted = client.post("/v1/admin/tenants", headers=admin_headers,
                          json={"email": "tls@example.com", "plan": "pro", "send_email": True})
    assert trusted.get_json()["email_sent"] is True and len(inbox.messages) == 1


def test_free_plan_key_is_not_emailed(client, admin_headers, smtp_inbox, runner):
    response = client.post("/v1/admin/tenants", headers=admin_headers,
                           json={"email": "free@example.com", "plan": "free", "send_email": True})
    assert smtp_inbox.messages == []
    # Said, not silently ignored: the caller asked for an email.
    body = response.get_json()
    assert response.status_code == 201 and body["email_sent"] is False
    assert body["email_error"] == "keys are emailed on paid plans only: starter, pro, enterprise"
    result = runner.invoke(args=["tenants", "create", "--email", "free-cli@example.com",
                                 "--send-email"])
    assert result.exit_code == 0 and smtp_inbox.messages == []
    assert result.stderr == ("warning: key email not sent: "
                             "keys are emailed on paid plans only: starter, pro, enterprise\n")
    without = client.post("/v1/admin/tenants", headers=admin_headers,
                          json={"email": "quiet@example.com", "plan": "free"}).get_json()
    assert without["email_sent"] is None and without["email_error"] is None


def test_smtp_failure_is_reported_and_the_tenant_still_exists(client, admin_headers, caplog):
    client.application.config.update(SMTP_HOST="127.0.0.1", SMTP_PORT=free_port(), SMTP_TIMEOUT=2)
    response = client.post("/v1/admin/tenants", headers=admin_headers,
                           json={"email": "unlucky@example.com", "plan": "pro", "send_email": True})
    body = response.get_json()
    assert response.status_code == 201
    assert body["email_sent"] is False and "email delivery failed" in body["email_error"]
    assert body["api_key"] not in caplog.text
    shown = client.get(f"/v1/admin/tenants/{body['tenant_id']}", headers=admin_headers)
    assert shown.status_code == 200


@pytest.mark.parametrize("path", ["/v1/admin/tenants/{}", "/v1/admin/tenants/{}/keys",
                                  "/v1/admin/tenants/{}/audit-log"])
def test_a_tenant_id_in_the_path_is_ascii_digits_only(client, admin_headers, path):
    # int() reads Arabic-Indic (U+0660..) and fullwidth (U+FF10..) digits as ASCII ones.
    created = client.post("/v1/admin/tenants", headers=admin_headers,
                          json={"email": "digits@example.com", "plan": "pro"}).get_json()
    tenant_id = created["tenant_id"]
    assert client.get(path.format(tenant_id), headers=admin_headers).status_code == 200
    for zero in (0x0660, 0xFF10):
        other_script = "".join(chr(zero + int(digit)) for digit in str(tenant_id))
        assert int(other_script) == tenant_id
        assert_envelope(client.get(path.format(other_script), headers=admin_headers), 404,
                        "not found")
