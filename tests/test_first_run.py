"""What a new user or an operator meets first: deploy/run-local.sh and bad settings, each run as a
real process. A failure says why in one line; nothing runs against the wrong server."""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ENCRYPTION_KEY, TEST_DATABASE_URL
from tests.servers import ROOT, free_port

# These processes run on a SQLite file of their own (or on no database) whatever the suite's
# backend: on PostgreSQL they would repeat the SQLite run to the byte, a minute of CI.
pytestmark = pytest.mark.skipif(bool(TEST_DATABASE_URL),
                                reason="SQLite whatever the backend: run by the SQLite suite")

RUN_LOCAL = str(ROOT / "deploy" / "run-local.sh")


@pytest.fixture
def environment(tmp_path):
    """A process environment on a fresh SQLite file, writing nothing into the checkout."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GUNICORN_", "TLS_", "FLASK_"))}
    env.update(DATABASE_URL="sqlite:///" + str(tmp_path / "first-run.db"), REDIS_URL="",
               SECRET_ENCRYPTION_KEY=ENCRYPTION_KEY, VENV=sys.prefix,
               SERVICE_LOG=str(tmp_path / "service.log"), FLASK_APP="wsgi")
    return env


def _one_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_run_local_with_its_port_taken_stops_at_once_naming_the_port(environment, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        environment["GUNICORN_BIND"] = f"127.0.0.1:{port}"
        result = subprocess.run([RUN_LOCAL], env=environment, capture_output=True, text=True,
                                timeout=60)
        holder.setblocking(False)
        with pytest.raises(BlockingIOError):
            holder.accept()  # nothing was sent to whatever holds the port
    assert result.returncode != 0 and result.stdout == ""
    line = _one_line(result.stderr)
    assert str(port) in line and "GUNICORN_BIND" in line
    assert not (tmp_path / "first-run.db").exists()  # stopped before migrating anything


def test_run_local_says_why_migrations_failed(environment):
    environment.update(DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
                       GUNICORN_BIND=f"127.0.0.1:{free_port()}")
    result = subprocess.run([RUN_LOCAL], env=environment, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    line = _one_line(result.stderr)
    assert "flask db upgrade" in line and "the database is unavailable" in line
    assert "Connection refused" in line and "nobody" not in line  # the cause, not the URL


def test_run_local_runs_the_demo_and_stops_its_server_on_sigterm(environment):
    port = _run_demo(environment)
    with pytest.raises(ConnectionRefusedError):  # the script's gunicorn is gone with it
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    # The database (key digests, sealed secrets) and the log are the owner's alone.
    for path in (environment["DATABASE_URL"][len("sqlite:///"):], environment["SERVICE_LOG"]):
        assert os.stat(path).st_mode & 0o077 == 0, oct(os.stat(path).st_mode)


def test_run_local_runs_again_on_a_demo_tenant_with_other_keys(environment, tmp_path):
    """A restart issues fresh demo credentials whatever keys the tenant made meanwhile: its
    first key rotated by id (rotate-key refuses to guess among several), or made again when it
    was revoked."""
    _run_demo(environment)
    added = _flask(environment, "tenants", "keys", "add", "demo@example.com", "--name", "backend")
    assert added.returncode == 0, added.stderr
    # Two keys, "default" listed first and rotated, with the list's lines arriving apart as on a
    # loaded host: the script reads to the end rather than closing the pipe on "backend".
    _run_demo(dict(environment, VENV=_venv_with_a_slow_key_list(tmp_path)))
    listed = _flask(environment, "tenants", "keys", "list", "demo@example.com").stdout
    (default,) = [line.split("\t")[0] for line in listed.splitlines() if "\tdefault\t" in line]
    revoked = _flask(environment, "tenants", "keys", "revoke", "demo@example.com", default)
    assert revoked.returncode == 0, revoked.stderr
    _run_demo(environment)  # "default" gone: made again, with every scope the demo uses


def _venv_with_a_slow_key_list(tmp_path):
    """A VENV running this one's programs, where `flask tenants keys list` hands its output on a
    line at a time, 0.2 s apart. A reader gone early makes it fail with nothing on stderr, as
    flask itself does on a closed pipe."""
    bin_dir = tmp_path / "slow-venv" / "bin"
    bin_dir.mkdir(parents=True)
    real = pathlib.Path(sys.prefix) / "bin"
    for name in ("python", "gunicorn"):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{real / name}" "$@"\n')
    (bin_dir / "flask").write_text(
        "#!/usr/bin/env bash\nset -o pipefail\n"
        'case "$*" in\n'
        f'  "tenants keys list "*) "{real / "flask"}" "$@" | while IFS= read -r line; do\n'
        "      sleep 0.2; printf '%s\\n' \"$line\"\n    done ;;\n"
        f'  *) exec "{real / "flask"}" "$@" ;;\n'
        "esac\n")
    for program in bin_dir.iterdir():
        program.chmod(0o755)
    return str(bin_dir.parent)


def _run_demo(environment):
    """deploy/run-local.sh to the end of its demo, then SIGTERM; returns its port."""
    port = free_port()
    environment["GUNICORN_BIND"] = f"127.0.0.1:{port}"
    process = subprocess.Popen([RUN_LOCAL], env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines, finished = [], threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line)
            if "Stop: Ctrl-C" in line:
                finished.set()
        finished.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert finished.wait(180), "".join(lines)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    output = "".join(lines)
    assert f"Intent verification service on http://127.0.0.1:{port}" in output, (
        output + process.stderr.read())
    for expected in ("cleared ->", "blocked -> InvalidSignature",
                     "replay blocked -> ReplayedIntent", "webhook.test delivered and verified ->",
                     "back on the HMAC scheme"):
        assert expected in output
    return port


def _flask(environment, *args):
    return subprocess.run([sys.executable, "-m", "flask", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [("tenants", "list"), ("db", "upgrade")])
def test_a_bad_setting_is_one_line_from_the_flask_cli(environment, command):
    environment["CLOCK_SKEW_SECONDS"] = "soon"
    result = _flask(environment, *command)
    assert result.returncode != 0 and result.stdout == ""
    assert _one_line(result.stderr) == (
        "Configuration error: CLOCK_SKEW_SECONDS must be an integer, got 'soon'")


@pytest.mark.parametrize("name, value", [("DATABASE_URL", "mysql://x/y"),
                                         ("TAXONOMY_PATH", "/nonexistent/taxonomy.json"),
                                         ("GUNICORN_WORKERS", "lots")])
def test_a_bad_setting_stops_gunicorn_with_one_line(environment, name, value):
    environment.update(GUNICORN_BIND=f"127.0.0.1:{free_port()}", GUNICORN_WORKERS="1")
    environment[name] = value
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py",
                             "wsgi:app"], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    line = _one_line(result.stderr)
    assert line.startswith("Configuration error: ") and name in line
    assert time.monotonic() - started < 60  # not a worker respawned in a loop
