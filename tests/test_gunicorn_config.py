"""deploy/gunicorn.conf.py in itself: the worker count in a container, from fake cgroup files."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from app.logs import JsonAccessAtoms
from tests.servers import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("gunicorn_conf_under_test",
                                                  ROOT / "deploy" / "gunicorn.conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def conf():
    return _load()


def _cgroups(tmp_path, self_cgroup, files):
    root = tmp_path / "cgroup"
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text + "\n")
    root.mkdir(exist_ok=True)
    (tmp_path / "self-cgroup").write_text(self_cgroup)
    return {"cgroup_root": root, "proc_self_cgroup": tmp_path / "self-cgroup"}


@pytest.mark.parametrize("self_cgroup, files, online, expected", [
    # cgroup v2 in a container (its own namespace): docker run --cpus=1.5 on an 8-core host
    ("0::/\n", {"cpu.max": "150000 100000"}, 8, 2),
    ("0::/\n", {"cpu.max": "max 100000"}, 8, 8),
    # v2 on a host: the quota of a parent slice binds its services
    ("0::/system.slice/intentgate.service\n",
     {"system.slice/cpu.max": "50000 100000",
      "system.slice/intentgate.service/cpu.max": "max 100000"}, 8, 1),
    # v1, the container's cgroup mounted where the host's path does not exist
    ("4:cpu,cpuacct:/docker/0123abcd\n3:memory:/docker/0123abcd\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "200000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 16, 2),
    ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, 4, 4),
    # a quota above the cores the process may use changes nothing
    ("0::/\n", {"cpu.max": "400000 100000"}, 2, 2),
])
def test_available_cpus_honours_the_container_cpu_quota(conf, tmp_path, self_cgroup, files,
                                                        online, expected):
    paths = _cgroups(tmp_path, self_cgroup, files)
    assert conf.available_cpus(online=online, **paths) == expected


def test_without_cgroup_files_the_cores_count(conf, tmp_path):
    missing = {"cgroup_root": tmp_path / "none", "proc_self_cgroup": tmp_path / "none" / "cgroup"}
    assert conf.cgroup_cpu_quota(**missing) is None
    assert conf.available_cpus(online=3, **missing) == 3


def test_default_workers_follow_the_available_cpus(monkeypatch):
    monkeypatch.delenv("GUNICORN_WORKERS", raising=False)
    conf = _load()
    assert conf.workers == 2 * conf.available_cpus() + 1


def test_the_access_line_is_one_json_object_with_credentials_masked_in_any_atom(conf):
    """The format's atoms, and the query and request line it leaves out today, as gunicorn's
    logger (conf.logger_class) fills them in."""
    assert conf.logger_class == "app.logs.GunicornLogger"
    atoms = JsonAccessAtoms({
        "t": "[25/Nov/2026:14:33:42 +0000]", "p": "<7>", "h": "127.0.0.1", "m": "DELETE",
        "U": "/v1/tenant/keys/key_live_1f\n\x00\\\"", "s": "404", "B": 46, "D": 6882,
        "q": "a=sig_live_2e&b=whsec_+/3d&c=1", "r": "DELETE /k/key_live_1f?b=whsec_+/3d HTTP/1.1",
        "{x-request-id}o": "rid-1"})
    line = json.loads(conf.access_log_format % atoms)
    assert line["path"] == "/v1/tenant/keys/key_live_[redacted]\n\x00\\\""
    assert line["request_id"] == "rid-1" and line["status"] == 404
    extra = json.loads('{"q": "%(q)s", "r": "%(r)s", "referer": "%(f)s"}' % atoms)
    assert extra == {"q": "a=sig_live_[redacted]&b=whsec_[redacted]&c=1",
                     "r": "DELETE /k/key_live_[redacted]?b=whsec_[redacted] HTTP/1.1",
                     "referer": "-"}


@pytest.mark.parametrize("value", [" On", "1", "yes", "off"])
def test_metrics_are_aggregated_whenever_the_app_reads_them_as_enabled(value, monkeypatch):
    """Every spelling app.config takes for true gives the workers the shared directory that
    /metrics adds up; without it each worker answered with its own counters."""
    from app.config import flag

    monkeypatch.setenv("METRICS_ENABLED", value)
    environment = {**os.environ, "METRICS_ENABLED": value}
    environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
    loaded = subprocess.run(
        [sys.executable, "-c", "import os, runpy; runpy.run_path('deploy/gunicorn.conf.py'); "
         "print(os.environ.get('PROMETHEUS_MULTIPROC_DIR') or '')"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60, check=True)
    directory = loaded.stdout.strip()
    assert bool(directory) == flag("METRICS_ENABLED", False)
    if directory:
        os.rmdir(directory)


@pytest.mark.parametrize("files", [
    lambda pair: (pair["cert"], pair["other_key"]),  # a key of another certificate
    lambda pair: ("/nonexistent/cert.pem", None),
    lambda pair: ("/etc/passwd", "/etc/passwd"),
    lambda pair: (None, pair["key"]),
    lambda pair: (pair["cert"], None),  # the key is not in the certificate's file
    lambda pair: (pair["cert"], pair["key"]),
])
def test_tls_files_gunicorn_cannot_serve_stop_it_with_one_line_and_a_pair_loads(tmp_path,
                                                                              files):
    """gunicorn started on these, said "Listening at: https://" and failed every handshake (or
    printed a traceback): now it stops at once, with one line and the settings exit status."""
    import trustme

    ca = trustme.CA()
    pair = {}
    for name, certificate in (("", ca.issue_cert("127.0.0.1")),
                              ("other_", ca.issue_cert("127.0.0.1"))):
        pair[name + "cert"] = tmp_path / f"{name}cert.pem"
        pair[name + "key"] = tmp_path / f"{name}key.pem"
        certificate.cert_chain_pems[0].write_to_path(pair[name + "cert"])
        certificate.private_key_pem.write_to_path(pair[name + "key"])
    certificate_file, key_file = files(pair)
    environment = {**os.environ, "TLS_CERTFILE": str(certificate_file or ""),
                   "TLS_KEYFILE": str(key_file or "")}
    loaded = subprocess.run([sys.executable, "-c", "import runpy; "
                             "runpy.run_path('deploy/gunicorn.conf.py')"],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    if certificate_file == pair["cert"] and key_file == pair["key"]:
        assert loaded.returncode == 0, loaded.stderr  # the pair that belongs together loads
        return
    assert loaded.returncode == 3, loaded.stderr
    (line,) = loaded.stderr.strip().splitlines()
    assert line.startswith("Configuration error: TLS_"), line


@pytest.mark.parametrize("name, value", [
    # A stray comma: gunicorn listened on 0.0.0.0:8000, every interface, beside the address.
    ("GUNICORN_BIND", "127.0.0.1:38001,"),
    ("GUNICORN_BIND", ",127.0.0.1:38001"),
    ("GUNICORN_BIND", "127.0.0.1:99999"),  # a traceback (OverflowError)
    ("GUNICORN_BIND", "127.0.0.1:0"),
    ("GUNICORN_BIND", "garbage"),  # five retries, seven lines
    ("GUNICORN_BIND", ":8000"),
    ("GUNICORN_BIND", "127.0.0.1"),
    ("GUNICORN_BIND", "::1:38001"),  # IPv6 without brackets: gunicorn's parser refuses it
    ("GUNICORN_BIND", "no-such-host.invalid:8000"),
    ("GUNICORN_BIND", "unix:/nonexistent/directory/gunicorn.sock"),
    ("GUNICORN_BIND", "fd://three"),
    ("GUNICORN_LOGLEVEL", "bogus"),  # was accepted
    ("GUNICORN_PRELOAD", "maybe"),  # was read as false, as "yes" was
    ("GUNICORN_ACCESSLOG", "/nonexistent/directory/access.log"),  # gunicorn's three lines
])
def test_a_gunicorn_setting_it_cannot_use_stops_it_with_one_line(name, value):
    environment = {key: text for key, text in os.environ.items()
                   if not key.startswith(("GUNICORN_", "TLS_"))}
    loaded = subprocess.run([sys.executable, "-c", "import runpy; "
                             "runpy.run_path('deploy/gunicorn.conf.py')"],
                            cwd=ROOT, env={**environment, name: value}, capture_output=True,
                            text=True, timeout=60)
    assert loaded.returncode == 3, loaded.stderr
    (line,) = loaded.stderr.strip().splitlines()
    assert line.startswith(f"Configuration error: {name}"), line


@pytest.mark.parametrize("raw, addresses", [
    (None, ["127.0.0.1:8000"]),
    ("", ["127.0.0.1:8000"]),  # GUNICORN_BIND= in an environment file: the default, loopback
    ("  ", ["127.0.0.1:8000"]),
    ("127.0.0.1:38001, [::1]:38002", ["127.0.0.1:38001", "[::1]:38002"]),
    ("0.0.0.0:8000", ["0.0.0.0:8000"]),
    ("localhost:8000", ["localhost:8000"]),
    ("tcp://127.0.0.1:38003", ["tcp://127.0.0.1:38003"]),  # gunicorn's parser takes tcp://
    ("unix:/tmp/intentgate.sock,fd://3", ["unix:/tmp/intentgate.sock", "fd://3"]),
])
def test_bind_addresses(conf, raw, addresses):
    assert conf.bind_addresses(raw) == addresses


def test_log_level_and_access_log(conf, monkeypatch, tmp_path):
    monkeypatch.delenv("GUNICORN_LOGLEVEL", raising=False)
    monkeypatch.delenv("GUNICORN_ACCESSLOG", raising=False)
    assert (conf.log_level(), conf.access_log()) == ("info", None)
    monkeypatch.setenv("GUNICORN_LOGLEVEL", "WARNING")
    assert conf.log_level() == "warning"
    for value in ("-", str(tmp_path / "access.log")):
        monkeypatch.setenv("GUNICORN_ACCESSLOG", value)
        assert conf.access_log() == value
    monkeypatch.setenv("GUNICORN_ACCESSLOG", str(tmp_path))  # a directory
    with pytest.raises(conf.app_settings.ConfigError):
        conf.access_log()
