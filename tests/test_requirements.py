"""requirements.txt is the runtime alone; requirements-dev.txt adds the test tools. Both README
commands, CI and the image install the file they need."""
import ast
import importlib.metadata
import re
import sys

from packaging.requirements import Requirement

from tests.servers import ROOT

TEST_TOOLS = {"pytest", "pytest-timeout", "pytest-httpserver", "aiosmtpd", "trustme",
              "time-machine", "schemathesis", "hypothesis", "pyyaml"}


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(name):
    """Distribution names a requirements file installs (its own lines and the files it includes)."""
    names = set()
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            names |= _requirements(line[3:].strip())
        elif line == "./sdk":
            names.add("intentgate")
        elif line:
            names.add(_canonical(Requirement(line).name))
    return names


def _closure(names):
    """The distributions `names` pull in, dependencies included (no extras)."""
    seen, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in importlib.metadata.requires(name) or []:
            parsed = Requirement(requirement)
            if parsed.marker is None or parsed.marker.evaluate({"extra": ""}):
                pending.append(_canonical(parsed.name))
    return seen


def _imported_modules(paths):
    modules = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules


def test_runtime_requirements_hold_no_test_tools_and_dev_adds_them():
    runtime, dev = _requirements("requirements.txt"), _requirements("requirements-dev.txt")
    assert not TEST_TOOLS & runtime
    assert TEST_TOOLS | runtime <= dev


def test_everything_the_service_imports_is_installed_by_the_runtime_requirements():
    sources = [*ROOT.glob("app/**/*.py"), *ROOT.glob("migrations/**/*.py"), ROOT / "wsgi.py",
               *ROOT.glob("deploy/*.py")]
    third_party = _imported_modules(sources) - set(sys.stdlib_module_names) - {"app", "__future__"}
    distributions = importlib.metadata.packages_distributions()
    installed = _closure(_requirements("requirements.txt"))
    missing = {module for module in third_party if not installed & {
        _canonical(name) for name in distributions.get(module, [module])}}
    assert not missing, f"imported by the service but only in requirements-dev.txt: {missing}"


def test_readme_ci_and_image_install_the_file_they_need():
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/pip install -r requirements.txt && deploy/run-local.sh" in readme
    assert ".venv/bin/pip install -r requirements-dev.txt && .venv/bin/python -m pytest" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements-dev.txt\n" in ci
    assert ci.count(".venv/bin/python -m pytest") == 3  # SQLite, PostgreSQL, scaled out
    assert "RUN pip install -r requirements.txt\n" in (ROOT / "deploy" / "Dockerfile").read_text()
