"""`[sandbox] setup` against real project shapes, through `execute` and real registries.

Each project is reconstructed from two `paths` commits; the second adds a dependency (or changes
an input), so the environment is prepared again for it. Setup reaches the registries through the
egress proxy, trusting the host's CA bundle (this network intercepts TLS). The npm registry does
not answer here, so the Node project has no dependencies.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import socket
import threading
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.hostaccess import REGISTRIES
from retcon_sandbox.report import FORMATS
from tests.conftest import ROOT, cli, git

SPEC = """\
source = "feature"
remote = "main"
cleaned = "feature-clean"

[sandbox]
{sandbox}

[[commit]]
message = "{first}"
paths = {first_paths}

[[commit]]
message = "{second}"
paths = {second_paths}
"""


# In every input file, so each session prepares its environments cold (none is left from
# another session), and keys differ only where a commit changes an input.
RUN = uuid.uuid4().hex


def recipe(name: str) -> str:
    """The `[sandbox]` body of docs/setup.md's recipe `name`, exactly as written there."""
    page = (ROOT / "docs" / "setup.md").read_text()
    match = re.search(r"```toml\n# recipe: " + re.escape(name) + r"\b[^\n]*\n\[sandbox\]\n(.*?)```",
                      page, re.DOTALL)
    assert match, f"no recipe {name!r} in docs/setup.md"
    return match.group(1).strip()


def make_project(root: Path, base: dict[str, str], feature: dict[str, str], sandbox: str,
                 first: list[str], second: list[str], tag: str | None = None) -> Path:
    """main holds `base`; feature adds `feature` in one messy commit; the spec splits it."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for files in (base, feature):
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "base" if files is base else "wip: everything")
        if files is base:
            if tag:
                git(root, "tag", tag)
            git(root, "checkout", "-q", "-b", "feature")
    git(root, "checkout", "-q", "main")
    spec = root / "history-spec.toml"
    spec.write_text(SPEC.format(sandbox=sandbox, first="first: without the new dependency",
                                first_paths=json.dumps(first),
                                second="second: with the new dependency",
                                second_paths=json.dumps(second)))
    return spec


def events(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


MADE: list[str] = []  # the environments these tests prepared, removed at the end
CACHES: set[str] = set()  # the package caches their setups used, removed at the end


@pytest.fixture(scope="module", autouse=True)
def remove_prepared(engine: DockerEngine) -> Iterator[None]:
    yield
    for tag in MADE:
        engine.remove_image(tag)
    for name in CACHES:
        engine.remove_volume(name)


def intercepted() -> tuple[str, ...]:
    """`--setup-allow-address` for each address a registry resolves to here that the egress
    proxy refuses as a documentation range: where this network's TLS interception answers."""
    found: set[str] = set()
    for host in REGISTRIES:
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM):
                address = ipaddress.ip_address(info[4][0])
                if any(address in ipaddress.ip_network(n) for n in DOCUMENTATION):
                    found.add(str(address))
    return tuple(arg for address in sorted(found) for arg in ("--setup-allow-address", address))


DOCUMENTATION = ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
ALLOW = intercepted()


def run(spec: Path, *extra: str, env: dict[str, str] | None = None
        ) -> tuple[int, list[dict[str, object]], str]:
    result = cli("execute", str(spec), "--json", "--non-interactive", *ALLOW, *extra, env=env,
                 timeout=900)
    found = events(result.out)
    MADE.extend(prepared(found))
    CACHES.update(str(e["cache"]) for e in found if e["event"] == "setup" and e.get("cache"))
    return result.code, found, result.out + result.err


def prepared(found: list[dict[str, object]]) -> list[str]:
    return [str(e["tag"]) for e in found if e["event"] == "setup_ready"]


def assert_reconstructed(spec: Path, code: int, found: list[dict[str, object]], log: str
                         ) -> None:
    assert code == 0, log
    repo = spec.parent
    assert git(repo, "rev-parse", "feature-clean^{tree}") == git(repo, "rev-parse",
                                                                 "feature^{tree}")
    tests = [e for e in found if e["event"] == "tests"]
    assert [e["verdict"] for e in tests] == ["PASS", "PASS"], log


def assert_rerun_prepares_nothing(engine: DockerEngine, spec: Path) -> None:
    """With the results forgotten, verify builds and tests both commits again, from the kept
    environments; --no-cache prepares them again."""
    git(spec.parent, "update-ref", "-d", "refs/notes/retcon-sandbox")
    result = cli("verify", "--spec", str(spec), "--json", *ALLOW, cwd=spec.parent,
                 timeout=900)
    found = events(result.out)
    assert result.code == 0, result.out + result.err
    assert not [e for e in found if e["event"] in ("setup", "setup_ready")], result.out
    assert [e["cached"] for e in found if e["event"] == "commit_verified"] == [False, False]
    kept = [engine.image_id(tag) for tag in sorted(set(MADE)) if engine.has_image(tag)]
    again = cli("verify", "--spec", str(spec), "--json", "--no-cache", *ALLOW, cwd=spec.parent,
                timeout=900)
    assert again.code == 0, again.out + again.err
    MADE.extend(prepared(events(again.out)))
    assert len(prepared(events(again.out))) == 2, again.out
    replaced = [image for image in kept if not engine.has_image(image)]
    assert len(replaced) == 2, (kept, replaced)  # the images prepared again are not left behind


def python_project(root: Path, sandbox: str) -> Path:
    """Tests that need a modern pytest from PyPI; the second commit adds a PyPI package."""
    base = {
        "requirements.txt": f"# {RUN} {root.name}\npytest>=8\n",
        "calc.py": "def add(a, b):\n    return a + b\n",
        "test_calc.py": "import pytest\nfrom calc import add\n\n\ndef test_add():\n"
                        "    assert add(2, 3) == 5\n"
                        "    assert int(pytest.__version__.split('.')[0]) >= 8\n",
    }
    feature = {
        "requirements.txt": f"# {RUN} {root.name}\npytest>=8\niniconfig==2.0.0\n",
        "settings.py": "import iniconfig\n\n\ndef load(path):\n"
                       "    return iniconfig.IniConfig(path)\n",
        "test_settings.py": "from settings import load\n\n\ndef test_load(tmp_path):\n"
                            "    (tmp_path / 'a.ini').write_text('[s]\\nk = v\\n')\n"
                            "    assert load(tmp_path / 'a.ini')['s']['k'] == 'v'\n",
        "calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    }
    return make_project(root, base, feature, sandbox, ["calc.py"],
                        ["requirements.txt", "settings.py", "test_settings.py"])


def test_a_python_project_whose_tests_need_a_pypi_package(engine: DockerEngine,
                                                          tmp_path: Path) -> None:
    spec = python_project(tmp_path / "py", recipe("pip"))
    code, found, log = run(spec)
    assert_reconstructed(spec, code, found, log)
    tags = prepared(found)
    assert len(tags) == 2 and tags[0] != tags[1], log  # the dependency: prepared again
    setup = next(e for e in found if e["event"] == "setup")
    assert setup["network"] == "registries" and setup["ca"], setup
    assert any("iniconfig" in str(e.get("line", "")) for e in found
               if e["event"] == "setup_output"), log
    assert all(engine.has_image(tag) for tag in tags)
    assert_rerun_prepares_nothing(engine, spec)


def test_the_uv_recipe(engine: DockerEngine, tmp_path: Path) -> None:
    spec = python_project(tmp_path / "uv", recipe("uv"))
    code, found, log = run(spec)
    assert_reconstructed(spec, code, found, log)
    assert len(set(prepared(found))) == 2, log


def test_a_package_versioned_by_setuptools_scm(engine: DockerEngine, tmp_path: Path) -> None:
    pyproject = ('[build-system]\nrequires = ["setuptools>=64", "setuptools-scm>=8"]\n'
                 'build-backend = "setuptools.build_meta"\n\n[project]\nname = "scmpkg"\n'
                 'dynamic = ["version"]\n{deps}\n[tool.setuptools]\npy-modules = ["scmpkg"]\n\n'
                 "[tool.setuptools_scm]\n# " + RUN + "\n")
    # The base commit is tagged; commit 1 (README) is 1 after it, commit 2 (VALUE = 2) is 2
    # after it. Each prepares its own environment (the base is not built: commit 1 passes),
    # whose editable install has its own distance.
    check = ("import importlib.metadata as m, pathlib, subprocess\nimport scmpkg\n\n\n"
             "def test_version():\n"
             "    described = subprocess.run(['git', 'describe', '--tags', '--long'],"
             " capture_output=True, text=True).stdout.strip()\n"
             "    base = pathlib.Path('README.md').read_text() == 'scmpkg\\n'\n"
             "    distance = 0 if base else 2 if scmpkg.VALUE == 2 else 1\n"
             "    assert described.startswith(f'v1.4.0-{distance}-g'), described\n"
             "    version = m.version('scmpkg')\n"
             "    assert version.startswith(f'1.4.1.dev{distance}+g'), version\n")
    base = {"pyproject.toml": pyproject.format(deps=""), "scmpkg.py": "VALUE = 1\n",
            "test_version.py": check, "README.md": "scmpkg\n"}
    feature = {"README.md": "scmpkg: values\n",
               "pyproject.toml": pyproject.format(deps='dependencies = ["iniconfig==2.0.0"]\n'),
               "scmpkg.py": "import iniconfig\n\nVALUE = 2\n"}
    spec = make_project(tmp_path / "scm", base, feature, recipe("setuptools-scm"),
                        ["README.md"], ["pyproject.toml", "scmpkg.py"], tag="v1.4.0")
    code, found, log = run(spec)
    assert_reconstructed(spec, code, found, log)
    assert len(set(prepared(found))) == 2, log
    shown = next(e for e in found if e["event"] == "git_metadata")
    assert shown["tag"] == "v1.4.0", log
    assert not [e for e in found if e["event"] == "base_check"], log  # commit 1 passed


def test_git_describe_gives_each_commits_distance_from_the_tag(engine: DockerEngine,
                                                               tmp_path: Path) -> None:
    """v1.0 is 2 commits under the merge-base: the cleaned commits are 3 and 4 after it (each
    tree asserts its own); the preflight's sandbox, on the base's tree, is the first commit's,
    which it is handed over to: 3 after it."""
    test = ("d=2; [ -f a.txt ] && d=$((d+1)); [ -f b.txt ] && d=$((d+1)); "
            "git describe --tags --long | grep \"^v1.0-$d-g[0-9a-f]*$\"")
    spec = make_project(tmp_path / "describe", {"README.md": "x\n"},
                        {"a.txt": "a\n", "b.txt": "b\n"}, f"test = '{test}'", ["a.txt"],
                        ["b.txt"], tag="v1.0")
    repo = spec.parent
    for n in (1, 2):
        git(repo, "commit", "-q", "--allow-empty", "-m", f"on main {n}")
    git(repo, "rebase", "-q", "main", "feature")
    git(repo, "checkout", "-q", "main")
    code, found, log = run(spec)
    assert_reconstructed(spec, code, found, log)
    assert git(repo, "describe", "--tags", "--long", "feature-clean").startswith("v1.0-4-g")
    shown = next(e for e in found if e["event"] == "git_metadata")
    assert (shown["tag"], shown["distance"]) == ("v1.0", 3), log
    assert "the hash part is synthetic" in FORMATS["git_metadata"](shown)


def test_a_missing_module_is_named_when_the_first_commit_fails(engine: DockerEngine,
                                                              tmp_path: Path) -> None:
    """The first commit fails; the base commit fails the same way for a missing module: the run
    stops (exit 1) naming it and the setup that installs it, before a fix is asked for."""
    base = {"pyproject.toml": "[project]\nname = 'needsyaml'\nversion = '1'\n",
            "test_conf.py": "import yaml\n\n\ndef test_load():\n"
                            "    assert yaml.safe_load('a: 1') == {'a': 1}\n"}
    spec = make_project(tmp_path / "yaml", base, {"README.md": "x\n", "NOTES": "y\n"},
                        'test = "python -m pytest -q -p no:cacheprovider"', ["README.md"],
                        ["NOTES"])
    before = spec.read_text()
    code, found, log = run(spec)
    assert code == 1, log
    error = next(e for e in found if e["event"] == "error")
    assert "the module 'yaml' is not installed" in str(error["message"]), log
    assert 'setup = ["pip install -e .[test]"]' in str(error["hint"]), log
    assert [e["verdict"] for e in found if e["event"] == "tests"] == ["FAIL (exit 2)"], log
    assert [e["passed"] for e in found if e["event"] == "base_check"] == [False], log
    git(spec.parent, "branch", "-D", "feature-clean")
    with_setup = before.replace("[sandbox]\n", '[sandbox]\nsetup = "pip --version"\n')
    spec.write_text(with_setup)
    code, found, log = run(spec, "--setup-network", "none")
    assert code == 1, log
    error = next(e for e in found if e["event"] == "error")
    assert "setup ran (pip --version) but does not install it" in str(error["message"]), log
    code, found, log = run(spec, "--setup-network", "none", "--no-base-check")
    assert code == 3, log  # stuck at commit 1: what the base check saves a user from
    assert not [e for e in found if e["event"] == "base_check"], log


def test_a_node_project_with_a_lock_file(engine: DockerEngine, tmp_path: Path) -> None:
    package = {"name": "shop", "version": "1.0.0", "private": True, "description": RUN,
               "scripts": {"test": "node test.js"}}
    lock = {"name": "shop", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
            "packages": {"": {"name": "shop", "version": "1.0.0"}}}
    base = {"package.json": json.dumps(package, indent=2) + "\n",
            "package-lock.json": json.dumps(lock, indent=2) + "\n",
            "index.js": "exports.total = (xs) => xs.reduce((a, b) => a + b, 0);\n",
            "test.js": "const assert = require('assert');\nconst {total} = require('./index');\n"
                       "assert.strictEqual(total([1, 2]), 3);\nconsole.log('ok');\n"}
    package2 = {**package, "version": "1.1.0", "engines": {"node": ">=18"}}
    lock2 = {**lock, "version": "1.1.0",
             "packages": {"": {"name": "shop", "version": "1.1.0", "engines": {"node": ">=18"}}}}
    feature = {"package.json": json.dumps(package2, indent=2) + "\n",
               "package-lock.json": json.dumps(lock2, indent=2) + "\n",
               "index.js": "exports.total = (xs) => xs.reduce((a, b) => a + b, 0);\n"
                           "exports.mean = (xs) => exports.total(xs) / xs.length;\n"}
    spec = make_project(tmp_path / "node", base, feature, recipe("npm"),
                        ["index.js"], ["package.json", "package-lock.json"])
    code, found, log = run(spec)
    assert_reconstructed(spec, code, found, log)
    assert len(set(prepared(found))) == 2, log
    assert any(e["event"] == "spec" and "retcon-sandbox/node:" in str(e["sandbox"])
               for e in found), log
    # npm_config_cache reaches npm, which writes there (its logs, with no registry here)
    measured = [e for e in found if e["event"] == "setup_cache_disk"]
    assert measured and all(int(str(e["files"])) > 1 for e in measured), measured


def test_a_rust_crate_with_a_dependency_from_the_crate_registry(engine: DockerEngine,
                                                                tmp_path: Path) -> None:
    manifest = f'# {RUN}\n[package]\nname = "digits"\nversion = "0.1.0"\nedition = "2021"\n\n' \
               "[dependencies]\n"
    base = {"Cargo.toml": manifest, "README.md": "digits\n",
            "src/lib.rs": "pub fn double(x: u32) -> u32 { x * 2 }\n\n#[test]\n"
                          "fn doubles() { assert_eq!(double(2), 4); }\n"}
    feature = {"Cargo.toml": manifest + 'itoa = "=1.0.11"\n', "README.md": "digits: shown\n",
               "src/lib.rs": "pub fn double(x: u32) -> u32 { x * 2 }\n\n"
                             "pub fn show(x: u32) -> String {\n"
                             "    itoa::Buffer::new().format(x).to_string()\n}\n\n#[test]\n"
                             "fn doubles() { assert_eq!(double(2), 4); }\n\n#[test]\n"
                             "fn shows() { assert_eq!(show(42), \"42\"); }\n"}
    spec = make_project(tmp_path / "rust", base, feature, recipe("cargo"),
                        ["README.md"], ["Cargo.toml", "src/lib.rs"])
    code, found, log = run(spec, "--timeout", "900")  # above the default: the command line's
    assert_reconstructed(spec, code, found, log)
    assert len(set(prepared(found))) == 2, log
    assert any("itoa" in str(e.get("line", "")) for e in found
               if e["event"] == "setup_output"), log


def test_setup_without_network_fails_clearly(engine: DockerEngine, tmp_path: Path) -> None:
    base = {"requirements.txt": "iniconfig==2.0.0\n", "test_a.py": "def test_a():\n    pass\n"}
    spec = make_project(tmp_path / "offline", base, {"test_b.py": "def test_b():\n    pass\n",
                                                     "test_c.py": "def test_c():\n    pass\n"},
                        'setup = "pip install --retries 0 --timeout 5 -r requirements.txt"\n'
                        'test = "python -m pytest -q"\ntimeout = 120',
                        ["test_b.py"], ["test_c.py"])
    before = spec.read_bytes()
    code, found, log = run(spec, "--setup-network", "none")
    assert code == 1, log
    assert spec.read_bytes() == before  # nothing was recorded: the setup ran first
    assert git(spec.parent, "branch", "--list", "feature-clean") == ""
    error = next(e for e in found if e["event"] == "error")
    assert error["kind"] == "setup", error
    assert "pip install" in str(error["message"]) and "--setup-network none" in str(
        error["hint"]), error
    assert "stuck" not in spec.read_text()
    assert "Traceback" not in log


def test_setup_reaches_the_registries_only(engine: DockerEngine, tmp_path: Path) -> None:
    reach = ("python3 -c \\\"import sys, urllib.request as u; "
             "[print(h, u.urlopen(h, timeout=10).status) for h in sys.argv[1:]]\\\"")
    base = {"a.txt": "a\n"}
    spec = make_project(tmp_path / "egress", base, {"b.txt": "b\n", "c.txt": "c\n"},
                        f'setup = ["{reach} https://pypi.org/simple/iniconfig/", '
                        f'"{reach} http://169.254.169.254/latest/meta-data/"]\n'
                        'test = "true"', ["b.txt"], ["c.txt"])
    code, found, log = run(spec)
    assert code == 1, log
    error = next(e for e in found if e["event"] == "error")
    assert error["kind"] == "setup"
    lines = [str(e["line"]) for e in found if e["event"] == "setup_output"]
    assert any(re.match(r"https://pypi.org/\S+ 200", line) for line in lines), lines
    assert "169.254.169.254" in str(error["hint"]) and "refused" in str(error["hint"]), error
    assert "--setup-registry" in str(error["hint"])


PROBE = """\
import socket, sys
port = int(sys.argv[1])
try:
    socket.getaddrinfo("pypi.org", 443)
    print("dns: resolved")
except OSError:
    print("dns: failed")
try:
    v6 = open("/proc/net/if_inet6").read().split()
except OSError:
    v6 = []
print("ipv6:", "present" if v6 else "none")  # not even link-local, to the host's bridge
own = socket.gethostbyname(socket.gethostname())
for host in (own.rsplit(".", 1)[0] + ".1", "172.17.0.1"):
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("host", host, "reached")
    except OSError as exc:
        print("host", host, "unreachable:", exc)
"""


class Listener:
    """A server on all of the host's addresses that counts who connects to it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("0.0.0.0", 0))
        self.port = self.server.getsockname()[1]
        self.reached: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, address = self.server.accept()
                self.reached.append(address[0])
                connection.close()


def test_setup_cannot_reach_the_host_or_resolve_names_itself(engine: DockerEngine,
                                                           tmp_path: Path) -> None:
    listener = Listener()
    spec = make_project(tmp_path / "around", {"probe.py": PROBE, "a.txt": "a\n"},
                        {"b.txt": "b\n", "c.txt": "c\n"},
                        f'setup = "python3 probe.py {listener.port}"\ntest = "true"',
                        ["b.txt"], ["c.txt"])
    code, found, log = run(spec)
    listener.server.close()
    assert code == 0, log
    lines = [str(e["line"]) for e in found if e["event"] == "setup_output"]
    assert "dns: failed" in lines, lines  # names are the proxy's to resolve
    assert "ipv6: none" in lines, lines
    hosts = [line for line in lines if line.startswith("host ")]
    assert len(hosts) >= 2 and all("unreachable" in line for line in hosts), lines
    assert listener.reached == []  # judged on the host: nothing came in


def test_a_setup_that_rewrites_the_venv_cannot_reach_the_helper_or_keep_variables(
        engine: DockerEngine, tmp_path: Path) -> None:
    """Setup (the repository's code) may rewrite /opt/venv, which is kept in the image and first
    on PATH: a .pth file would run in any interpreter that reads it, and python3 there may be
    anything. The helper (uid 10001) must use neither. A --pass-env variable reaches each
    command but is never kept in the prepared image."""
    plant = ("import site; open(site.getsitepackages()[0] + '/zz_probe.pth', 'w').write("
             "'import os; open(\\'/tmp/pth-%d\\' % os.getuid(), \\'w\\').close()\\n')")
    spec = make_project(tmp_path / "venv", {"plant.py": plant, "a.txt": "a\n"},
                        {"b.txt": "b\n", "c.txt": "c\n"},
                        'setup = ["python3 plant.py", "ln -sf /bin/false /opt/venv/bin/python3"]\n'
                        'test = "test ! -e /tmp/pth-10001 && test \\"$RETCON_PROBE\\" = passed"',
                        ["b.txt"], ["c.txt"])
    code, found, log = run(spec, "--pass-env", "RETCON_PROBE", env={"RETCON_PROBE": "passed"})
    assert_reconstructed(spec, code, found, log)
    for tag in prepared(found):
        variables = engine.client.images.get(tag).attrs["Config"]["Env"]
        assert not [v for v in variables if v.startswith("RETCON_PROBE")], variables


POISON = ("python3 - <<'EOF'\nimport site\nopen(site.getsitepackages()[0] + '/zz_poison.pth', "
          "'w').write('import os; os._exit(0)\\n')\nEOF\n")


def verify(spec: Path, rev: str, *extra: str) -> tuple[int, list[dict[str, object]], str]:
    result = cli("verify", rev, "--spec", str(spec), "--json", "--setup-network", "none",
                 *extra, cwd=spec.parent, timeout=900)
    found = events(result.out)
    MADE.extend(prepared(found))
    return result.code, found, result.out + result.err


def test_a_poisoned_environment_passes_nothing_of_the_users(engine: DockerEngine,
                                                            tmp_path: Path) -> None:
    """An untrusted branch changes only the script setup runs, to plant a .pth that ends every
    python3 with exit 0. The user's own failing commit, with the original script, gets an
    environment of its own; and a result is tied to the very image it ran in: once that image
    is gone, the result is not reused."""
    spec = make_project(tmp_path / "poison", {"scripts/setup.sh": f"# {RUN}\ntrue\n",
                                              "check.py": "raise SystemExit(1)\n"},
                        {"b.txt": "b\n", "c.txt": "c\n"},
                        'setup = ["sh scripts/setup.sh"]\ntest = "python3 check.py"',
                        ["b.txt"], ["c.txt"])
    root = spec.parent
    git(root, "checkout", "-q", "-b", "untrusted", "main")
    (root / "scripts" / "setup.sh").write_text(f"# {RUN}\n{POISON}")
    git(root, "commit", "-q", "-am", "a harmless-looking change to the setup script")
    git(root, "checkout", "-q", "main")

    code, found, log = verify(spec, "untrusted")  # the poison works in its own environment
    assert code == 0 and len(prepared(found)) == 1, log
    code, found, log = verify(spec, "main")  # the user's commit: not in that environment
    assert code == 3, log
    assert len(prepared(found)) == 1, log
    [row] = [e for e in found if e["event"] == "commit_verified"]
    assert row["passed"] is False and row["cached"] is False

    code, found, log = verify(spec, "main")  # kept: the result is reused, nothing prepared
    assert code == 3 and not prepared(found), log
    assert [e["cached"] for e in found if e["event"] == "commit_verified"] == [True]
    for tag in set(MADE):
        if engine.has_image(tag):
            engine.remove_image(tag)
    code, found, log = verify(spec, "main")  # its environment is gone: it runs again
    assert code == 3 and len(prepared(found)) == 1, log
    assert [e["cached"] for e in found if e["event"] == "commit_verified"] == [False]


CACHE_SETUP = ('setup = ["pip install -r requirements.txt", '
               '"c=${PIP_CACHE_DIR:-/tmp/none} && mkdir -p $c && touch $c/kept-$(wc -l '
               '<requirements.txt) && ls $c"]\n')


def test_a_second_setup_reuses_the_first_ones_downloads(engine: DockerEngine,
                                                       tmp_path: Path) -> None:
    """The second commit adds a dependency: its setup says why it is made, and finds what the
    first setup left in the repository's package cache: pip takes six from its cache, even
    on a network whose TLS proxy strips PyPI's Cache-Control (the egress proxy restores it
    for files.pythonhosted.org/packages/), and a mark of the test's own is there too. Builds
    and tests never see the cache; --no-package-cache sets up without it, and pip downloads
    six again; `clean` removes a cache no environment uses."""
    spec = make_project(tmp_path / "cache", {"requirements.txt": f"# {RUN}\nsix==1.16.0\n",
                                             "t.py": "import six\n"},
                        {"requirements.txt": f"# {RUN}\nsix==1.16.0\niniconfig==2.0.0\n",
                         "u.py": "import iniconfig\n", "docs/requirements.txt": "sphinx\n",
                         "v.py": "import six\n"},
                        CACHE_SETUP + 'test = "python3 -c \'import os, six; '
                        'c = \\"/var/cache/retcon-sandbox\\"; '
                        'assert not os.path.exists(c) or not os.listdir(c)\'"',
                        ["v.py", "docs/requirements.txt"], ["requirements.txt", "u.py"])
    code, found, log = run(spec)
    assert code == 0, log
    setups = [e for e in found if e["event"] == "setup"]
    assert [e["reason"] for e in setups] == ["first environment for this repository",
                                             "requirements.txt changed"], log
    assert setups[0]["cache"] and setups[0]["cache"] == setups[1]["cache"], log
    assert engine.has_volume(str(setups[0]["cache"]))
    measured = [e for e in found if e["event"] == "setup_cache_disk"]  # within the cap: kept
    assert len(measured) == 2 and all(0 < int(str(e["used"])) < 4 << 30
                                      and 0 < int(str(e["files"])) < 1 << 20 for e in measured)
    lines = [str(e["line"]) for e in found if e["event"] == "setup_output"]
    # the first setup lists its own mark; the second lists the first's too
    assert [line for line in lines if line.startswith("kept-")] == ["kept-2", "kept-2",
                                                                    "kept-3"], log
    assert [line.strip() for line in lines if "six-1.16.0" in line and "cached" in line] == \
        ["Using cached six-1.16.0-py2.py3-none-any.whl (11 kB)"], log
    git(spec.parent, "update-ref", "-d", "refs/notes/retcon-sandbox")
    result = cli("verify", "--spec", str(spec), "--json", "--no-cache", "--no-package-cache",
                 *ALLOW, cwd=spec.parent, timeout=900)
    again = events(result.out)
    MADE.extend(prepared(again))
    assert result.code == 0, result.out + result.err
    assert [e["cache"] for e in again if e["event"] == "setup"] == [None, None]
    assert not any("Using cached" in str(e.get("line")) for e in again), result.out
    # verify -j 2 may prepare either environment first; neither sees the other's mark
    assert sorted(str(e["line"]) for e in again if e["event"] == "setup_output"
                  and str(e["line"]).startswith("kept-")) == ["kept-2", "kept-3"], result.out
    for tag in set(MADE):
        if engine.has_image(tag):
            engine.remove_image(tag)
    assert cli("clean").code == 0
    assert not engine.has_volume(str(setups[0]["cache"]))  # no environment uses it any more


def test_a_setup_over_its_own_timeout_mid_history_says_what_was_recorded(
        engine: DockerEngine, tmp_path: Path) -> None:
    """The second commit changes the setup's script, which then runs past the setup's own
    timeout: the message names `setup_timeout` and --setup-timeout (not the commands'
    --timeout), and says truly what this run recorded before (it used to say nothing was)."""
    spec = make_project(tmp_path / "slow", {"setup.sh": f"# {RUN}\ntrue\n", "a.txt": "a\n"},
                        {"setup.sh": f"# {RUN}\nsleep 300\n", "b.txt": "b\n", "c.txt": "c\n"},
                        'setup = "sh setup.sh"\ntest = "true"\nsetup_timeout = 15',
                        ["b.txt"], ["setup.sh", "c.txt"])
    code, found, log = run(spec, "--setup-network", "none", "--no-package-cache")
    assert code == 1, log
    error = next(e for e in found if e["event"] == "error")
    assert error["kind"] == "setup", error
    assert error["message"] == ("setup timed out: sh setup.sh was still running when its 15 s "
                                "were over (setup_timeout: all of [sandbox] setup's commands "
                                "together)"), error
    assert "--setup-timeout S" in str(error["hint"]), error
    made = len(git(spec.parent, "rev-list", "main..feature-clean").split())
    histories = [c.get("history", []) for c in tomllib.loads(spec.read_text())["commit"]]
    numbers = [i for i, history in enumerate(histories, 1) if history]
    assert numbers[0] == 1 and len(histories[0]) == 3, histories  # commit #1: complete
    span = f"#{numbers[0]}" + (f" to #{numbers[-1]}" if len(numbers) > 1 else "")
    assert (f"This run recorded {sum(map(len, histories))} history entries in "
            f"history-spec.toml (commit {span}; {made} commit(s) made on feature-clean): they "
            "are kept, and a rerun goes on from them.") in str(error["hint"]), error


def test_a_second_environment_takes_the_first_ones_crates_from_the_cache(
        engine: DockerEngine, tmp_path: Path) -> None:
    """Two environments of one verification: the first fetches regex and its crates, the
    second (itoa added) copies them in from the package cache, and downloads only what is
    new, counted through the egress proxy. (The sparse index is fetched again: this network's
    TLS proxy strips the validators cargo would revalidate it with.)"""
    manifest = f'# {RUN}\n[package]\nname = "probe"\nversion = "0.1.0"\nedition = "2021"\n\n' \
               "[dependencies]\n"
    spec = make_project(tmp_path / "crates", {"Cargo.toml": manifest, "src/lib.rs": ""},
                        {"Cargo.toml": manifest + 'regex = "=1.10.6"\n', "a.txt": "a\n"},
                        'image = "retcon-sandbox/rust"\nsetup = "cargo fetch"\ntest = "true"',
                        ["Cargo.toml"], ["a.txt"])
    repo = spec.parent
    git(repo, "checkout", "-q", "feature")
    (repo / "Cargo.toml").write_text(manifest + 'regex = "=1.10.6"\nitoa = "=1.0.11"\n')
    git(repo, "commit", "-q", "-am", "itoa")
    git(repo, "checkout", "-q", "main")
    result = cli("verify", "main..feature", "--spec", str(spec), "--json", "-j", "1",
                 "--timeout", "900", *ALLOW, cwd=repo, timeout=1200)
    found = events(result.out)
    MADE.extend(prepared(found))
    CACHES.update(str(e["cache"]) for e in found if e["event"] == "setup" and e.get("cache"))
    assert result.code == 0, result.out + result.err
    ready = [e for e in found if e["event"] == "setup_ready"]
    assert all(0 <= float(str(e["image"])) <= float(str(e["seconds"])) for e in ready), ready
    first, second = (int(str(e["downloaded"])) for e in ready)
    assert first > 1_000_000 and second < first / 2, ready
