"""The documents say what the code does: README.md's commands and settings, docs/api.md's error
texts and paths. A setting added to app/config.py, or an error text renamed, fails here until
the page says so."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
API = (ROOT / "docs" / "api.md").read_text()
SETTING = re.compile(r"""(?:\b_[a-z_]+\(|\bflag\(|environ\.get\()\s*["']([A-Z][A-Z0-9_]+)["']""")


def _code_blocks(text, language):
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _settings_table(text):
    """Every variable named in the first column of README's Configuration table."""
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) < 250


def test_the_readme_starts_with_the_two_commands_ci_and_a_newcomer_run():
    run, test = (block.strip() for block in _code_blocks(README, "sh")[:2])
    assert run == ("python3.11 -m venv .venv && .venv/bin/pip install -r requirements.txt"
                   " && deploy/run-local.sh")
    assert (ROOT / "deploy" / "run-local.sh").stat().st_mode & 0o111
    ci = (ROOT / ".ci" / "run").read_text().replace(" -q", "")
    # Each of its steps: CI makes the environment once, then runs the last step beside the
    # PostgreSQL suite.
    for step in test.split(" && "):
        assert step in ci, f"README's test command's {step!r} is not what .ci/run runs"


def test_every_setting_read_is_in_the_readme_table_and_nothing_else_is():
    read_by_app = set(SETTING.findall((ROOT / "app" / "config.py").read_text()))
    read_by_gunicorn = set(SETTING.findall((ROOT / "deploy" / "gunicorn.conf.py").read_text()))
    documented = _settings_table(README)
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_ENCRYPTION_KEY"} <= read_by_app
    assert read_by_app - documented == set(), "settings app/config.py reads but README omits"
    assert documented - read_by_app - read_by_gunicorn == set(), "README names unread settings"


def _error_texts():
    section = API.split("## Errors", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if line.startswith("| 4") or line.startswith("| 5"):
            yield from re.findall(r"`([^`]+)`", line.split("|")[2])


def test_every_documented_error_text_is_one_the_code_raises():
    code = "\n".join(path.read_text() for path in (ROOT / "app").rglob("*.py"))
    texts = list(_error_texts())
    assert len(texts) > 20
    missing = [text for text in texts if re.split(r"<[a-z_]+>", text)[0].strip() not in code]
    assert missing == []


def test_every_v1_path_in_the_reference_exists(client):
    documented = set(re.findall(r"`(?:GET|POST|PUT|PATCH|DELETE) (/v1/[^`?\s]*)", API))
    served = client.get("/openapi.json").get_json()["paths"]
    # The reference writes path parameters as {id}; the document names each one.
    served_shapes = {re.sub(r"\{[^}]+\}", "{}", path) for path in served}
    missing = [path for path in documented
               if re.sub(r"\{[^}]+\}|ID", "{}", path) not in served_shapes]
    assert len(documented) > 10 and missing == []
