"""flask tenants ... and flask admin-keys ... through the CLI runner."""
import json
import os
import threading
from datetime import timedelta

import pytest
import time_machine
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from flask.cli import FlaskGroup
from sqlalchemy import event, select

from app import create_app, crypto
from app.admin.models import AdminKey
from app.extensions import db
from tests.servers import free_port
from tests.support import set_usage


def _invoke(runner, *args):
    return runner.invoke(args=list(args))


def _create(runner, email="cli@example.com", plan="starter"):
    result = _invoke(runner, "tenants", "create", "--email", email, "--plan", plan, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_create_prints_the_credentials_once_as_json(runner, client):
    created = _create(runner)
    assert set(created) == {"tenant_id", "email", "plan", "api_key", "signing_secret"}
    assert created["email"] == "cli@example.com" and created["plan"] == "starter"
    assert created["signing_secret"].startswith("sig_live_") and len(created["signing_secret"]) == 73
    usage = client.get("/v1/tenant/usage", headers={"X-Service-Key": created["api_key"]})
    assert usage.get_json()["plan"] == "starter"
    shown = _invoke(runner, "tenants", "show", str(created["tenant_id"]))
    assert created["api_key"] not in shown.output and created["signing_secret"] not in shown.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--email", "not-an-email"], "email is not a valid email address"),
        (["--email", "jörg@example.com"], "Error: email must contain ASCII characters only"),
        (["--email", "x@example.com", "--plan", "gold"], "Invalid value for '--plan'"),
    ],
)
def test_create_rejects_bad_input_with_one_line(runner, args, message):
    result = _invoke(runner, "tenants", "create", *args)
    assert result.exit_code != 0
    assert message in result.output


@pytest.mark.parametrize("args", [
    ["tenants", "show", "\udcff"],
    ["tenants", "deactivate", "\udcff\udcfe"],
    ["tenants", "keys", "add", "1", "--name", "caf\udce9", "--scope", "intents"],
    ["admin-keys", "revoke", "--name", "\udcff"],
    ["webhooks", "delete", "1", "\udcff"],
])
def test_an_argument_that_is_not_utf8_is_one_line_and_writes_nothing(runner, args):
    """Bytes of an argument that are not UTF-8 reach Python as lone surrogates: psycopg2 and
    the JSON output cannot encode them, and commands ended in a traceback."""
    tenant = _create(runner, email="bytes@example.com")
    args = [str(tenant["tenant_id"]) if arg == "1" else arg for arg in args]
    result = _invoke(runner, *args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    position = next(index for index, arg in enumerate(args) if not arg.isascii())  # after args[0]
    assert (f"Error: argument {position} after '{args[0]}' is not valid UTF-8 text"
            in result.output), result.output
    listed = _invoke(runner, "tenants", "keys", "list", str(tenant["tenant_id"])).output
    assert listed.count("ak_") == 1  # nothing was added, revoked or deactivated


def test_duplicate_email_is_refused(runner):
    _create(runner, email="dup@example.com")
    result = _invoke(runner, "tenants", "create", "--email", "DUP@example.com")
    assert result.exit_code == 1
    assert "Error: a tenant with this email already exists" in result.output


def test_a_taken_email_or_admin_key_name_is_found_without_a_failing_statement(app, runner):
    """PostgreSQL logs a failing statement with its parameters: a refused INSERT would put the
    new sealed signing secret in the server's log."""
    _create(runner, email="taken@example.com")
    assert _invoke(runner, "admin-keys", "create", "--name", "taken").exit_code == 0
    failures = []

    def failed(context):
        failures.append(context.statement)

    with app.app_context():
        engine = db.engine
    event.listen(engine, "handle_error", failed)
    try:
        taken = _invoke(runner, "tenants", "create", "--email", "Taken@example.com")
        again = _invoke(runner, "admin-keys", "create", "--name", "taken")
    finally:
        event.remove(engine, "handle_error", failed)
    assert taken.output.strip() == "Error: a tenant with this email already exists"
    assert again.output.strip() == "Error: an admin key with this name already exists"
    assert failures == []


def test_list_show_set_plan_and_usage(app, runner):
    created = _create(runner, plan="free")
    assert "cli@example.com\tfree\tactive" in _invoke(runner, "tenants", "list").output
    result = _invoke(runner, "tenants", "set-plan", "cli@example.com", "pro")
    assert result.exit_code == 0 and json.loads(result.stdout)["plan"] == "pro"
    set_usage(app, created["tenant_id"], 5)
    usage = json.loads(_invoke(runner, "tenants", "usage", str(created["tenant_id"])).stdout)
    assert usage == {"email": "cli@example.com", "plan": "pro", "usage_count": 5,
                     "rate_limit": 500_000, "remaining": 499_995}


@pytest.mark.parametrize("reference", ["nobody@example.com", "99999999999999999999", "²", "٣"])
# The listings' table headers are not printed first.
@pytest.mark.parametrize("command", [["show"], ["audit"], ["keys", "list"],
                                     ["signing-keys", "list"]])
def test_unknown_tenant_is_a_one_line_error(runner, reference, command):
    result = _invoke(runner, "tenants", *command, reference)
    assert result.exit_code == 1 and result.output.strip() == "Error: tenant not found"


def test_a_public_key_file_that_is_not_text_is_a_one_line_error(runner, tmp_path):
    tenant = _create(runner)
    binary = tmp_path / "key.der"
    binary.write_bytes(b"\x30\x2a\xff\xfe" + bytes(40))
    result = _invoke(runner, "tenants", "signing-keys", "add", str(tenant["tenant_id"]),
                     str(binary))
    assert result.exit_code == 1
    assert result.output == "Error: PUBLIC_KEY_FILE must be text: a PEM file or base64\n"


def test_a_public_key_file_past_the_limit_is_refused_without_reading_it_whole(runner, tmp_path):
    """A stream that never ends (a FIFO kept open here; /dev/zero grew the command to 23 GB):
    the limit's one extra character is read, then the schema refuses it."""
    tenant = _create(runner)
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    done, closed = threading.Event(), threading.Event()

    def feed():
        with open(fifo, "w", encoding="utf-8") as stream:
            stream.write("A" * 10_000)  # past the limit, within the pipe's buffer
            stream.flush()
            done.wait(20)  # open, with nothing more to read: a read to the end waits for this
        closed.set()

    feeding = threading.Thread(target=feed)
    feeding.start()
    try:
        result = _invoke(runner, "tenants", "signing-keys", "add", str(tenant["tenant_id"]),
                         str(fifo))
        answered_before_the_end = not closed.is_set()
    finally:
        done.set()
        feeding.join()
    assert answered_before_the_end
    assert result.exit_code == 1
    assert result.output == "Error: public_key must be 1 to 8192 characters\n"


def test_a_public_key_registered_twice_names_the_key_that_holds_it(runner, tmp_path):
    tenant = _create(runner)
    public_key = ed25519.Ed25519PrivateKey.generate().public_key()
    pem = tmp_path / "key.pem"
    pem.write_bytes(public_key.public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo))
    added = json.loads(_invoke(runner, "tenants", "signing-keys", "add",
                               str(tenant["tenant_id"]), str(pem)).stdout)
    again = _invoke(runner, "tenants", "signing-keys", "add", str(tenant["tenant_id"]), str(pem))
    assert again.exit_code == 1
    assert again.output == ("Error: this public key is already registered (already registered "
                            f"as signing key {added['id']})\n")


def test_deactivate_activate_and_rotate_key(runner, client):
    created = _create(runner)
    headers = {"X-Service-Key": created["api_key"]}
    assert _invoke(runner, "tenants", "deactivate", "cli@example.com").exit_code == 0
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 401
    assert _invoke(runner, "tenants", "activate", "cli@example.com").exit_code == 0
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 200
    rotated = _invoke(runner, "tenants", "rotate-key", "cli@example.com")
    new_key = rotated.stdout.strip()
    assert new_key.startswith("key_live_") and new_key != created["api_key"]
    assert client.get("/v1/tenant/usage", headers=headers).status_code == 401
    assert client.get("/v1/tenant/usage", headers={"X-Service-Key": new_key}).status_code == 200


def test_rotate_key_names_the_key_it_replaces_and_never_guesses(runner, client, leak_watch):
    """An operator rotating a leaked key must not replace another one in use and leave the
    leaked one working: with several keys, the key is named."""
    created = _create(runner)
    tenant_id = str(created["tenant_id"])
    added = _invoke(runner, "tenants", "keys", "add", tenant_id, "--name", "backend")
    backend_key = added.stdout.splitlines()[0].rsplit(" ", 1)[1]
    leak_watch.add(backend_key)
    refused = _invoke(runner, "tenants", "rotate-key", tenant_id)
    assert (refused.exit_code, refused.output) == (
        1, "Error: the tenant has 2 active API keys: name the one to rotate\n")
    assert _invoke(runner, "tenants", "rotate-key", tenant_id, "--key-id", "nope").output == \
        "Error: API key not found\n"
    listed = _invoke(runner, "tenants", "keys", "list", tenant_id).stdout.splitlines()
    (default_id,) = [line.split("\t")[0] for line in listed if "\tdefault\t" in line]
    rotated = _invoke(runner, "tenants", "rotate-key", tenant_id, "--key-id", default_id)
    assert rotated.exit_code == 0, rotated.output
    prefix = crypto.display_prefix(created["api_key"])
    assert rotated.stderr == f"replaced key {default_id} (default, {prefix}...)\n"
    new_key = rotated.stdout.strip()
    leak_watch.add(new_key)
    for key, status in ((created["api_key"], 401), (backend_key, 200), (new_key, 200)):
        assert client.get("/v1/tenant/usage", headers={"X-Service-Key": key}).status_code == status


def test_rotate_signing_secret_keeps_the_previous_one_for_the_grace(app, runner):
    from app.tenants.service import find_tenant

    created = _create(runner)
    result = _invoke(runner, "tenants", "rotate-signing-secret", "cli@example.com", "--grace", "300")
    new_secret = result.stdout.strip()
    assert new_secret.startswith("sig_live_") and new_secret != created["signing_secret"]
    with app.app_context():
        tenant = find_tenant("cli@example.com")
    assert tenant.previous_signing_secret_sealed is not None
    assert tenant.previous_signing_secret_expires_at is not None
    with app.app_context():
        assert crypto.unseal(tenant.previous_signing_secret_sealed) == created["signing_secret"]
        assert crypto.unseal(tenant.signing_secret_sealed) == new_secret


def test_admin_keys_create_list_revoke(runner, client):
    result = _invoke(runner, "admin-keys", "create", "--name", "billing", "--json")
    issued = json.loads(result.stdout)
    headers = {"X-Service-Key": issued["api_key"]}
    assert client.get("/v1/admin/tenants", headers=headers).status_code == 200
    assert "billing\tactive" in _invoke(runner, "admin-keys", "list").output
    again = _invoke(runner, "admin-keys", "create", "--name", "billing")
    assert again.exit_code == 1 and "already exists" in again.output
    assert _invoke(runner, "admin-keys", "revoke", "--name", "billing").exit_code == 0
    response = client.get("/v1/admin/tenants", headers=headers)
    assert response.status_code == 401
    assert response.get_json()["error"] == "Invalid or inactive API key"


def test_revoking_an_admin_key_again_keeps_when_it_was_revoked(app, runner):
    _invoke(runner, "admin-keys", "create", "--name", "billing")

    def revoked_at():
        with app.app_context():
            return db.session.execute(select(AdminKey.revoked_at)).scalar_one()

    assert _invoke(runner, "admin-keys", "revoke", "--name", "billing").exit_code == 0
    first = revoked_at()
    with time_machine.travel(first + timedelta(hours=1)):
        assert _invoke(runner, "admin-keys", "revoke", "--name", "billing").exit_code == 0
    assert revoked_at() == first


def _admin_key(runner, name):
    result = _invoke(runner, "admin-keys", "create", "--name", name, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("name, error", [
    ("", "admin key name must not be blank"),
    ("   ", "admin key name must not be blank"),
    ("3", "admin key name must not be all digits: ids are numbers"),
    (" 42 ", "admin key name must not be all digits: ids are numbers"),
    ("x" * 101, "admin key name must be at most 100 characters"),
    ("bell\x07", "admin key name must not contain control characters"),
])
def test_admin_key_names_are_never_blank_or_mistakable_for_ids(app, runner, name, error):
    _admin_key(runner, "existing")
    result = _invoke(runner, "admin-keys", "create", "--name", name)
    assert result.exit_code == 1 and result.output == f"Error: {error}\n"
    with app.app_context():
        assert db.session.query(AdminKey).count() == 1


def test_admin_key_names_are_trimmed(runner):
    assert _admin_key(runner, "  billing ")["name"] == "billing"
    again = _invoke(runner, "admin-keys", "create", "--name", "billing")
    assert again.output == "Error: an admin key with this name already exists\n"


def test_revoke_takes_an_id_or_an_explicit_name(app, runner, client):
    billing, reports = _admin_key(runner, "billing"), _admin_key(runner, "reports")
    # A key named "1" from before names were checked: `revoke 1` means the key with id 1.
    with app.app_context():
        db.session.add(AdminKey(name=str(billing["admin_key_id"]), key_digest="0" * 64,
                                key_prefix="key_live_000000", signing_secret_sealed="x"))
        db.session.commit()
    result = _invoke(runner, "admin-keys", "revoke", str(billing["admin_key_id"]))
    assert result.output == f"admin key {billing['admin_key_id']} (billing) revoked\n"
    with app.app_context():
        states = {key.name: key.active for key in db.session.query(AdminKey)}
    assert states == {"billing": False, "reports": True, str(billing["admin_key_id"]): True}
    result = _invoke(runner, "admin-keys", "revoke", "--name", str(billing["admin_key_id"]))
    assert result.exit_code == 0
    assert _invoke(runner, "admin-keys", "revoke", "--name", "reports").exit_code == 0
    for issued in (billing, reports):
        response = client.get("/v1/admin/tenants", headers={"X-Service-Key": issued["api_key"]})
        assert response.status_code == 401


@pytest.mark.parametrize("args, error", [
    (["reports"], "admin key ids are numbers; to revoke by name, use --name reports"),
    ([], "give either the admin key's id or --name NAME"),
    (["1", "--name", "reports"], "give either the admin key's id or --name NAME"),
    (["99999"], "admin key not found"),
    (["99999999999999999999"], "admin key not found"),
    (["²"], "admin key ids are numbers; to revoke by name, use --name '²'"),
    (["--name", "nobody"], "admin key not found"),
])
def test_revoke_errors_are_one_line(app, runner, args, error):
    _admin_key(runner, "reports")
    result = _invoke(runner, "admin-keys", "revoke", *args)
    assert result.exit_code == 1 and result.output == f"Error: {error}\n"
    with app.app_context():
        assert db.session.query(AdminKey).one().active


def test_list_commands_print_a_header_row(runner):
    _create(runner)
    _admin_key(runner, "billing")
    tenants = _invoke(runner, "tenants", "list").stdout.splitlines()
    assert tenants[0] == "ID\tEMAIL\tPLAN\tSTATE"
    assert tenants[1].split("\t")[1:4] == ["cli@example.com", "starter", "active"]
    admin_keys = _invoke(runner, "admin-keys", "list").stdout.splitlines()
    assert admin_keys[0] == "ID\tNAME\tSTATE\tPREFIX"
    assert admin_keys[1].split("\t")[1:3] == ["billing", "active"]


@pytest.mark.parametrize("command", [
    [], ["show"], ["usage"], ["set-plan"], ["deactivate"], ["activate"], ["rotate-key"],
    ["rotate-signing-secret"], ["set-signature-scheme"],
])
def test_help_says_what_tenant_is(runner, command):
    result = _invoke(runner, "tenants", *command, "--help")
    assert "TENANT is the tenant's id (as `list` shows it) or its email address." in " ".join(
        result.output.split())


def test_commands_speak_to_a_person_without_log_lines(runner, client, capsys):
    runs = [
        _invoke(runner, "tenants", "create", "--email", "quiet@example.com"),
        _invoke(runner, "tenants", "set-plan", "quiet@example.com", "pro"),
        _invoke(runner, "tenants", "rotate-key", "quiet@example.com"),
        _invoke(runner, "admin-keys", "create", "--name", "quiet"),
        _invoke(runner, "admin-keys", "revoke", "--name", "quiet"),
        _invoke(runner, "tenants", "show", "nobody@example.com"),
    ]
    assert [result.exit_code for result in runs] == [0, 0, 0, 0, 0, 1]
    # rotate-key names the key it replaced there, the new key alone going to stdout.
    assert [result.stderr for result in runs[:-1]] == ["", "", runs[2].stderr, "", ""]
    assert runs[2].stderr.startswith("replaced key ") and runs[2].stderr.count("\n") == 1
    assert runs[-1].stderr == "Error: tenant not found\n"
    # Outside the CLI the service logs as before: one JSON line per request.
    capsys.readouterr()
    client.get("/health")
    assert '"message": "request"' in capsys.readouterr().err


def test_flask_limiter_limits_lists_every_v1_route(settings, monkeypatch):
    # The `flask` command with the plugin commands installed packages add through entry points:
    # Flask-Limiter's `flask limiter limits` shows the bucket and the failure limit of each
    # /v1 route, declared once per blueprint.
    monkeypatch.setenv("COLUMNS", "250")
    app = create_app(dict(settings))
    flask_command = FlaskGroup(create_app=lambda: app)
    result = CliRunner().invoke(flask_command, ["limiter", "limits"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    v1_routes = {rule.endpoint for rule in app.url_map.iter_rules()
                 if rule.rule.startswith("/v1/")}
    assert len(v1_routes) > 20
    for endpoint in v1_routes:
        at = next(index for index, line in enumerate(lines) if f"{endpoint}: /v1/" in line)
        assert "100 per 60 second" in lines[at + 1] and "20 per 1 minute" in lines[at + 2], \
            lines[at:at + 3]


def test_expires_in_counts_from_the_exact_time(runner):
    tenant = _create(runner)
    asked_at = 1_800_000_000.49
    with time_machine.travel(asked_at, tick=False):
        result = _invoke(runner, "tenants", "keys", "add", str(tenant["tenant_id"]),
                         "--name", "brief", "--expires-in", "3")
        assert result.exit_code == 0, result.output
        listed = _invoke(runner, "tenants", "keys", "list", str(tenant["tenant_id"])).stdout
    (expires_at,) = [line.split("\t")[-1] for line in listed.splitlines() if "\tbrief\t" in line]
    assert int(expires_at) == 1_800_000_004  # never before asked_at + 3, and the next second


def test_a_database_out_of_reach_is_one_line_without_its_password(base_settings):
    port = free_port()
    app = create_app({**base_settings,
                      "SQLALCHEMY_DATABASE_URI": f"postgresql://ops:sekrit@127.0.0.1:{port}/x"})
    for command in (["tenants", "create", "--email", "a@example.com"], ["secrets", "reseal"],
                    ["tenants", "list"], ["admin-keys", "list"], ["db", "upgrade"],
                    ["intents", "purge"], ["webhooks", "list", "1"],
                    ["webhooks", "deliver", "--once"]):
        result = app.test_cli_runner().invoke(args=command)
        assert result.exit_code == 1
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: the database is unavailable: ") and str(port) in line
        assert "sekrit" not in result.output
