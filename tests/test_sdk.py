"""The SDK against the real service, started on a free port on the embedded defaults."""
import json

import pytest

from intentgate import (AuthenticationError, Blocked, Client, ScaleResponse, ValidationError)
from intentgate.demo import main as demo_main, run as run_demo
from intentgate.signing import canonical_json


@pytest.fixture
def live(embedded_gunicorn):
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "sdk@example.com", "--plan", "starter",
                             "--json"))
    server = start(workers=1, threads=4)
    return server, created


def test_the_demo_shows_cleared_tampered_replayed_and_usage(live):
    server, created = live
    lines = []
    payload, replay = run_demo(Client(server.url, created["api_key"]), created["signing_secret"],
                               out=lines.append, ed25519=True)
    assert payload == {"answer": "The capital of France is Paris."}
    assert replay.reason == "ReplayedIntent"
    text = "\n".join(lines)
    assert "blocked -> InvalidSignature" in text and "replay blocked -> ReplayedIntent" in text
    assert "Usage this month: 4 of 50000" in text
    assert "cleared -> {'answer': 'Signed with Ed25519.'}" in text
    assert "an HMAC signature now -> InvalidSignature" in text
    assert "back on the HMAC scheme; the demo key is revoked" in text


def test_the_demo_switches_no_scheme_unless_asked(live, capsys):
    """The Ed25519 step switches the tenant's scheme with no grace: only with --ed25519, and a
    key that may not do it stops the demo with one line, on the scheme it found."""
    server, created = live
    client = Client(server.url, created["api_key"])
    lines = []
    run_demo(client, created["signing_secret"], out=lines.append)
    assert not any(line.startswith("5.") for line in lines) and client.list_signing_keys() == []
    narrow = client.create_key("demo-intents-only", scopes=["intents"])["api_key"]
    arguments = ["--base-url", server.url, "--signing-secret", created["signing_secret"],
                 "--api-key", narrow, "--ed25519"]
    assert demo_main(arguments) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("demo stopped: this key lacks the scope signing:write (status 403")
    cleared = run_demo(client, created["signing_secret"], out=lambda line: None)[0]
    assert cleared == {"answer": "The capital of France is Paris."}  # still on HMAC


def test_client_round_trip_and_typed_errors(live):
    server, created = live
    client = Client(server.url, created["api_key"])
    intent = client.generate("sdk-user-token-1", ttl=60)
    assert intent.intent_hash.startswith("sha256:") and intent.intent_class == "other"
    signed = ScaleResponse.sign(created["signing_secret"], intent.intent_hash, {"n": 1})
    with pytest.raises(ValidationError) as empty:  # sent as given, never replaced
        client.verify(intent.intent_hash, signed, idempotency_key="")
    assert empty.value.message == "Idempotency-Key must be 1 to 255 printable ASCII characters"
    first = client.verify(intent.intent_hash, signed, idempotency_key="sdk-retry-1")
    again = client.verify(intent.intent_hash, signed, idempotency_key="sdk-retry-1")
    assert first.cleared and not first.replayed and again.replayed and again.payload == {"n": 1}
    with pytest.raises(ValidationError) as bad:
        client.generate("short")
    assert bad.value.message == "token too short" and bad.value.status == 400
    with pytest.raises(Blocked):
        client.guard("sdk-user-token-2", lambda intent_hash: ScaleResponse.sign(
            "sig_live_" + "0" * 64, intent_hash, {"forged": True}))
    old_key = client.api_key
    rotation = client.rotate_key()
    assert client.api_key == rotation.new_key != old_key
    assert rotation.new_key not in repr(rotation) and rotation.message in repr(rotation)
    assert client.usage().usage_count == 2  # the idempotent replay counted nothing
    with pytest.raises(AuthenticationError) as refused:
        Client(server.url, old_key).usage()
    assert refused.value.message == "Invalid or inactive API key" and refused.value.request_id


def test_client_reads_a_cleared_payload_as_the_doubles_that_were_signed(live):
    """The gate answers JCS text, which spells a whole double beyond 2**53 as digits; the
    client reads those as the doubles they are, so the payload is the one that was signed."""
    server, created = live
    client = Client(server.url, created["api_key"])
    payload = {"big": 1e16, "odd": 1.2345678901234567e19, "tiny": 1e-7, "n": 3}
    cleared = client.guard("sdk-user-token-3", lambda intent_hash: ScaleResponse.sign(
        created["signing_secret"], intent_hash, payload))
    assert cleared == payload and isinstance(cleared["odd"], float)
    assert canonical_json(cleared) == canonical_json(payload)


def test_client_self_service(live, leak_watch):
    server, created = live
    client = Client(server.url, created["api_key"])
    second = client.create_key("second", expires_in=3600)
    leak_watch.add(second["api_key"])
    assert Client(server.url, second["api_key"]).usage().email == "sdk@example.com"
    assert sorted(key["name"] for key in client.list_keys()) == ["default", "second"]
    assert client.revoke_key(second["id"])["revoked_at"] is not None
    with pytest.raises(AuthenticationError):
        Client(server.url, second["api_key"], max_retries=0).usage()
    actions = [entry["action"] for entry in client.audit_log()]
    assert actions[:2] == ["api_key.revoked", "api_key.created"]
    assert len(client.daily_usage(days=7)) == 7


def test_client_makes_narrow_keys_and_names_the_missing_scope(live, leak_watch):
    server, created = live
    client = Client(server.url, created["api_key"])
    backend = client.create_key("backend", scopes=["intents"])
    leak_watch.add(backend["api_key"])
    assert backend["scopes"] == ["intents"]
    narrow = Client(server.url, backend["api_key"], max_retries=0)
    assert narrow.generate("sdk-user-token-3").intent_hash.startswith("sha256:")
    with pytest.raises(AuthenticationError) as refused:
        narrow.set_signature_scheme("bound")
    assert refused.value.status == 403
    assert refused.value.message == "this key lacks the scope signing:write"
