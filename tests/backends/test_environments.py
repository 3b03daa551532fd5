"""Prepared environments without Docker: what keys them, what setup may reach, and how the helper
keeps and restores what setup made. The Docker tier runs real setups (tests/docker/test_setup.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import os
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.api import Sandbox
from retcon_sandbox.backends.docker.preparer import host_ca_bundle
from retcon_sandbox.backends.environments import Environments
from retcon_sandbox.backends.envkeys import (
    DEFAULT_INPUTS,
    environment_key,
    inputs,
    setup_files,
    unmatched_inputs,
)
from retcon_sandbox.backends.local import LocalBackend
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import RetconError, UsageError
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.report import JsonReporter
from retcon_sandbox.spec.settings import DEFAULTS, SETTINGS, SandboxSettings
from tests.conftest import git

# The in-container modules, under the names they ship as (mypy checks them as files).
egress = importlib.import_module("retcon_sandbox.sandbox.egress")
supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")


def entries(**files: str) -> dict[str, TreeEntry]:
    return {path.replace("__", "/").replace("_dot_", "."): TreeEntry("100644", sha)
            for path, sha in files.items()}


SETUP_R = ("pip install -r requirements.txt",)


def key_of(files: dict[str, TreeEntry], setup: tuple[str, ...] = ("pip install -e .",),
           image: str = "sha256:1", tag: str | None = None) -> str:
    return environment_key(image, setup, True, tag, inputs(files, Patterns(DEFAULT_INPUTS), setup))


def test_the_key_follows_the_inputs_and_nothing_else() -> None:
    base = entries(pyproject_dot_toml="a1", src__app_dot_py="b1", requirements_dot_txt="c1")
    same = key_of(base)
    assert key_of({**base, **entries(src__app_dot_py="b2", README_dot_md="d1")}) == same
    assert key_of({**base, **entries(requirements_dot_txt="c2")}, setup=SETUP_R) != \
        key_of(base, setup=SETUP_R)  # a dependency setup reads
    assert key_of({**base, **entries(requirements__dev_dot_txt="e1")}) == same  # not read
    assert key_of({**base, **entries(package_dot_json="f1")}) != same
    assert key_of({**base, **entries(Cargo_dot_lock="g1")}) != same
    assert key_of({**base, **entries(go_dot_sum="h1")}) != same
    assert key_of(base, setup=("pip install -e .", "pip install pytest")) != same
    assert key_of(base, image="sha256:2") != same  # a rebuilt base image
    assert key_of(base, tag="v1.0") != same
    other_repository = environment_key("sha256:1", ("pip install -e .",), True, None,
                                       inputs(base, Patterns(DEFAULT_INPUTS)), "/elsewhere/.git")
    assert other_repository != same  # never shared between repositories


TREE = {path: TreeEntry("100644", f"{n:040x}") for n, path in enumerate([
    "scripts/setup.sh", "install.sh", "tools/x.py", "tools/y.sh", "Makefile", "sub/Makefile",
    "req/dev.txt", "constraints/ci.txt", "vendor/pkg/setup.py", "vendor/pkg/pkg/__init__.py",
    "src/app.py", "README.md", "docs/requirements.txt", "scripts/lib/real.sh"])}


@pytest.mark.parametrize(("command", "named"), [
    ("sh scripts/setup.sh", {"scripts/setup.sh"}),
    ("./install.sh", {"install.sh"}),
    ("bash ./scripts//setup.sh --fast", {"scripts/setup.sh"}),
    ("python tools/x.py", {"tools/x.py"}),
    ("python3 -m pip install -r req/dev.txt -c constraints/ci.txt",
     {"req/dev.txt", "constraints/ci.txt"}),
    ("pip install -rreq/dev.txt --constraint=constraints/ci.txt",
     {"req/dev.txt", "constraints/ci.txt"}),
    ("make", {"Makefile"}),
    ("make -C sub deps", {"Makefile", "sub/Makefile"}),
    ("cd tools && ./y.sh", {"tools/x.py", "tools/y.sh"}),
    ("sh -c 'python tools/x.py'", {"tools/x.py"}),
    ("sh < install.sh", {"install.sh"}),
    ("pip install ./vendor/pkg", {"vendor/pkg/setup.py", "vendor/pkg/pkg/__init__.py"}),
    ("pip install -e .", set()),
    ("pip install pytest", set()),
    ("sh $HOME/x.sh /etc/passwd ../outside.sh", set()),
    # a shell pattern names what it matches in the tree (it used to name nothing)
    ("cp *.sh /usr/local/bin/", {"install.sh"}),
    ("cd scripts && cp *.sh /opt/", {"install.sh", "scripts/setup.sh", "scripts/lib/real.sh"}),
    ("python tools/[xy].* && cp req/d?v.txt constraints/[!a]*.txt /x",
     {"tools/x.py", "tools/y.sh", "req/dev.txt", "constraints/ci.txt"}),
    ("cp -r vendor/* /opt/", {"vendor/pkg/setup.py", "vendor/pkg/pkg/__init__.py"}),
    ("cp */*.txt /x", {"req/dev.txt", "constraints/ci.txt", "docs/requirements.txt"}),
    ("cp *.pth [z-a] /x", set()),
])
def test_tracked_files_a_setup_command_names_key_the_environment(command: str,
                                                                  named: set[str]) -> None:
    assert setup_files((command,), TREE) == named
    before = environment_key("sha256:1", (command,), True, None,
                             inputs(TREE, Patterns(DEFAULT_INPUTS), (command,)))
    for path in named:
        changed = {**TREE, path: TreeEntry("100644", "f" * 40)}
        assert environment_key("sha256:1", (command,), True, None,
                               inputs(changed, Patterns(DEFAULT_INPUTS), (command,))) != before
    unrelated = {**TREE, "src/app.py": TreeEntry("100644", "e" * 40)}
    assert environment_key("sha256:1", (command,), True, None,
                           inputs(unrelated, Patterns(DEFAULT_INPUTS), (command,))) == before


def test_a_named_link_keys_what_it_points_to() -> None:
    tree = {**TREE, "setup.sh": TreeEntry("120000", "1" * 40),
            "scripts/run": TreeEntry("120000", "2" * 40)}
    targets = {"1" * 40: "scripts/run", "2" * 40: "lib/real.sh"}
    found = setup_files(("sh setup.sh",), tree, lambda entry: targets[entry.sha])
    assert found == {"setup.sh", "scripts/run", "scripts/lib/real.sh"}
    loop = {"a": TreeEntry("120000", "3" * 40), "b": TreeEntry("120000", "4" * 40)}
    cycle = {"3" * 40: "b", "4" * 40: "a"}
    assert setup_files(("sh a",), loop, lambda entry: cycle[entry.sha]) == {"a", "b"}


def test_default_inputs_are_found_at_any_depth() -> None:
    files = entries(packages__web__package_dot_json="a1", crates__core__Cargo_dot_toml="b1",
                    src__app_dot_py="c1", pyproject_dot_toml="d1")
    assert list(inputs(files, Patterns(DEFAULT_INPUTS))) == [
        "crates/core/Cargo.toml", "packages/web/package.json", "pyproject.toml"]


def test_each_repository_has_its_own_scope(tmp_path: Path) -> None:
    from retcon_sandbox.spec.statedir import SCOPE_FILE, StateDir

    first = StateDir(tmp_path / "a")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    scope = first.scope()
    assert scope == first.scope() and len(scope) == 32  # kept
    assert StateDir(tmp_path / "b").scope() != scope  # another repository, another scope
    assert sorted(p.name for p in first.root.iterdir()) == [SCOPE_FILE]  # nothing else left
    (tmp_path / "c" / "retcon-sandbox").mkdir(parents=True)
    os.symlink(first.root / SCOPE_FILE, tmp_path / "c" / "retcon-sandbox" / SCOPE_FILE)
    with pytest.raises(RetconError, match="cannot read or make"):
        StateDir(tmp_path / "c").scope()  # a planted symlink is never followed


def test_inputs_can_be_chosen() -> None:
    files = entries(pyproject_dot_toml="a1", deps__lock_dot_json="b1")
    chosen = Patterns(("deps/*.json",))
    assert inputs(files, chosen) == {"deps/lock.json": {"": "100644 b1"}}
    assert inputs(files, Patterns(())) == {}  # setup_inputs = []: none
    assert SandboxSettings.parse({"setup_inputs": []}).setup_inputs == ()
    assert unmatched_inputs((), ["a"]) == [] and unmatched_inputs(None, []) == []
    assert unmatched_inputs(("deps/*.json", "nope/*.lock"), list(files)) == ["nope/*.lock"]


@pytest.mark.parametrize(("host", "ok"), [
    ("pypi.org", True), ("PyPI.org.", True), ("files.pythonhosted.org", True),
    ("evil-pypi.org", False), ("pypi.org.evil.com", False), ("deb.debian.org", True),
    ("mirror.example.com", True), ("example.com", True), ("other.com", False),
])
def test_the_proxy_allows_named_registries_only(host: str, ok: bool) -> None:
    allowed = [*hostaccess.REGISTRIES, "mirror.example.com", ".example.com"]
    assert egress.allowed_host(host, allowed) is ok


@pytest.mark.parametrize(("address", "bad"), [
    ("169.254.169.254", True), ("127.0.0.1", True), ("10.1.2.3", True), ("172.17.0.1", True),
    ("192.168.1.1", True), ("100.64.0.1", True), ("0.0.0.0", True), ("::1", True),
    ("fe80::1", True), ("fd00::1", True), ("::ffff:169.254.169.254", True),
    ("::169.254.169.254", True), ("2002:a9fe:a9fe::1", True), ("64:ff9b:1::a9fe:a9fe", True),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True), ("x", True), ("fec0::1", True),
    ("::ffff:0:a9fe:a9fe", True), ("192.88.99.1", True),
    ("151.101.0.223", False), ("2a04:4e42::223", False),
    ("192.0.2.1", True), ("198.51.100.7", True), ("203.0.113.80", True),  # documentation
    ("2001:db8::1", True), ("::ffff:198.51.100.7", True),
])
def test_the_proxy_never_connects_to_private_or_metadata_addresses(address: str, bad: bool
                                                                    ) -> None:
    assert egress.blocked(address) is bad


def test_the_proxy_sets_host_and_port_itself() -> None:
    method, host, port, upstream = egress.parse(
        b"GET http://pypi.org/simple/x/ HTTP/1.1\r\nHost: attacker.example\r\n"
        b"Proxy-Authorization: x\r\nAccept: */*\r\n\r\n")
    assert (method, host, port) == ("GET", "pypi.org", 80)
    assert upstream.startswith(b"GET /simple/x/ HTTP/1.1\r\nHost: pypi.org\r\n")
    assert b"attacker" not in upstream and b"Proxy-" not in upstream and b"Accept" in upstream
    assert egress.parse(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n")[1:3] == ("pypi.org", 443)
    for refused in (b"CONNECT pypi.org:80 HTTP/1.1", b"CONNECT pypi.org:22 HTTP/1.1",
                    b"GET http://pypi.org:443/ HTTP/1.1", b"CONNECT [::1]:x HTTP/1.1",
                    b"GET /local HTTP/1.1", b"CONNECT pypi.org:99999999 HTTP/1.1", b"garbage",
                    b"CONNECT pypi.org:4\xb23 HTTP/1.1", b"CONNECT pypi.org:443 HTTP/2",
                    # a Host of the client's own, smuggled past the rewrite
                    b"GET http://pypi.org/ HTTP/1.1\r\nX: a\nHost: evil.example",
                    b"GET http://pypi.org/ HTTP/1.1\r\nAccept: x\r\n Host: evil.example",
                    b"GET http://pypi.org/ HTTP/1.1\r\nHost : evil.example",
                    b"GET http://pypi.org/\rx HTTP/1.1"):
        with pytest.raises(egress.Refused):
            egress.parse(refused + b"\r\n\r\n")


def test_a_name_that_cannot_be_looked_up_is_refused_not_raised() -> None:
    with pytest.raises(egress.Refused, match="does not resolve"):
        asyncio.run(egress.resolve("a" * 70 + ".debian.org", 443, [".debian.org"]))


def test_setup_network_options_come_from_the_command_line_and_are_checked() -> None:
    access = hostaccess.from_command_line([], False, "full", ["Mirror.Example.com."])
    assert access.setup.network == "full"
    assert "mirror.example.com" in access.setup.registries
    assert "pypi.org" in access.setup.registries
    for bad in ("http://x.com", "x", "a b.com", "-x.com", "x.com:8080"):
        with pytest.raises(UsageError, match="--setup-registry"):
            hostaccess.from_command_line([], False, "registries", [bad])
    assert hostaccess.HostAccess().setup.network == "registries"


def test_the_hosts_ca_bundle_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "corp.pem"
    certificate = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----"
    key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----"
    bundle.write_text(f"# a proxy's combined file\n{key}\n{certificate}\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    found = host_ca_bundle()
    assert found is not None and found[0] == bundle
    assert found[1] == certificate.encode() + b"\n"  # the key is never copied
    bundle.write_text(key)  # no certificate at all: the next candidate
    found = host_ca_bundle()
    assert found is None or found[0] != bundle
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    found = host_ca_bundle()
    assert found is None or found[0] != bundle


def test_what_setup_made_is_kept_and_restored_but_never_over_the_tree(tmp_path: Path) -> None:
    workspace, kept, later = tmp_path / "ws", tmp_path / "kept", tmp_path / "later"
    for path, text in {"app.py": "tree", "node_modules/dep/index.js": "dep",
                       "build/out.txt": "made", "src/app.egg-info/PKG-INFO": "meta",
                       ".git/HEAD": "git"}.items():
        (workspace / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace / path).write_text(text)
    (workspace / "node_modules/.bin").mkdir()
    os.symlink("../dep/index.js", workspace / "node_modules/.bin/dep")
    copied = supervisor.copy_tree(str(workspace), str(kept), {"app.py"})
    assert copied == 4
    assert not (kept / "app.py").exists() and not (kept / ".git").exists()
    assert os.readlink(kept / "node_modules/.bin/dep") == "../dep/index.js"
    # a later commit's tree: its own app.py and build/out.txt win over what setup made
    (later / "build").mkdir(parents=True)
    (later / "app.py").write_text("later tree")
    (later / "build/out.txt").write_text("later tree")
    os.symlink("/etc", later / "src")  # a tree's symlink is never written through
    supervisor.copy_tree(str(kept), str(later), set())
    assert (later / "app.py").read_text() == "later tree"
    assert (later / "build/out.txt").read_text() == "later tree"
    assert (later / "node_modules/dep/index.js").read_text() == "dep"
    assert not Path("/etc/app.egg-info").exists()


def listing_of(folder: Path) -> bytes:
    """The `update-index -z --index-info` records of the files under `folder` (but `.git`),
    as the host sends a tree's: a file's blob hashed as git hashes it."""
    records = []
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if name.split("/")[0] == ".git" or (path.is_dir() and not path.is_symlink()):
            continue
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        mode = "120000" if path.is_symlink() else "100755" if os.access(path, os.X_OK) \
            else "100644"
        sha = subprocess.run(["git", "hash-object", "--no-filters", "--stdin"], input=data,
                             capture_output=True, check=True).stdout.decode().strip()
        records.append(f"{mode} {sha}\t{name}\0".encode())
    return b"".join(records)


def test_the_workspace_becomes_a_tagged_repository(tmp_path: Path) -> None:
    (tmp_path / "pkg.py").write_text("x = 1\n")
    assert supervisor.make_git(str(tmp_path), "v1.4.0", 0, listing_of(tmp_path)) == 0
    repo = Repo(tmp_path)
    assert repo.describe_tag("HEAD") == "v1.4.0"
    assert repo.ls_tree(repo.tree_of("HEAD")).keys() == {"pkg.py"}


def test_the_workspace_is_as_far_from_its_tag_as_the_commit(tmp_path: Path) -> None:
    (tmp_path / "pkg.py").write_text("x = 1\n")
    assert supervisor.make_git(str(tmp_path), "v1.4.0", 5, listing_of(tmp_path)) == 0
    repo = Repo(tmp_path)
    assert repo.describe("HEAD") == ("v1.4.0", 5)
    assert repo.ls_tree(repo.tree_of("HEAD")).keys() == {"pkg.py"}
    assert repo.ls_tree(repo.tree_of("v1.4.0")) == {}  # the synthetic history holds no file
    assert repo.describe("v1.4.0") == ("v1.4.0", 0)


def test_a_commit_is_placed_by_its_own_distance_from_its_tag(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path / "repo")
    root = repo.commit_files("main", {"a": "1\n"}, "root")
    assert repo.describe(root) is None  # no tag: no version, as before
    envs = Environments(repo, LocalBackend(), DEFAULTS, hostaccess.HostAccess().setup,
                        JsonReporter(), "main")
    assert envs.version((root, 1)) == (None, 0)
    git(tmp_path / "repo", "tag", "v2.0", root)
    sha = repo.commit_files("main", {"a": "2\n"}, "second")
    assert repo.describe(sha) == ("v2.0", 1)
    envs = Environments(repo, LocalBackend(), DEFAULTS, hostaccess.HostAccess().setup,
                        JsonReporter(), "main")
    assert envs.version((sha, 1)) == ("v2.0", 2)
    assert envs.version((sha, 0)) == ("v2.0", 1)
    assert envs.version(None) == ("v2.0", 0)  # no place (plan, the squash check): as before


def test_a_tag_name_that_is_not_version_like_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert supervisor.make_git(str(tmp_path), "v1;touch${IFS}pwned") == 0  # git allows the name
    assert Repo(tmp_path).describe_tag("HEAD") is None
    assert not (tmp_path / "pwned").exists()


def test_a_change_to_an_input_gets_the_commands_a_new_sandbox(tmp_path: Path) -> None:
    """The loop's working state: a fix that edits a lock file is built in the environment of
    the new inputs; other edits keep the open sandbox."""
    repo = Repo.init(tmp_path / "repo")
    sha = repo.commit_files("main", {"app.py": "x = 1\n", "requirements.txt": "a\n"}, "base")
    opened: list[str] = []
    patterns = Patterns(DEFAULT_INPUTS)

    def key(tree: str) -> str:
        return environment_key("sha256:1", SETUP_R, True, None,
                               inputs(repo.ls_tree(tree), patterns, SETUP_R))

    with contextlib.ExitStack() as stack:
        def opener(tree: str) -> Sandbox:
            opened.append(tree)
            box = stack.enter_context(LocalBackend().open("t"))
            box.load_tree(repo.tree_tar(tree, 1 << 20))
            return box

        state = WorkState(repo, opener, repo.tree_of(sha), sha, 1 << 20, key)
        assert state.box is state.command_box and len(opened) == 1
        state.put("app.py", TreeEntry("100644", repo.write_blob(b"x = 2\n")))
        assert "x = 2" in state.command_box.read_file("app.py").text and len(opened) == 1
        state.put("requirements.txt", TreeEntry("100644", repo.write_blob(b"a\nb\n")))
        box = state.command_box
        assert len(opened) == 2 and opened[1] == state.tree()
        assert box.read_file("requirements.txt").text.split() == ["1", "a", "2", "b"]
        assert "x = 2" in box.read_file("app.py").text


def test_the_spec_page_lists_every_sandbox_setting() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "spec.md").read_text()
    for setting in SETTINGS:
        assert f"| `{setting.key}` | {setting.shown} | {setting.meaning} |" in page, setting.key


def test_passed_variables_key_the_environment_by_hmac_only(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Notes are read by others: a digest without a key would let them test guesses of a
    --pass-env value. Under the user's key, names and values key it, and nothing else can."""
    import hashlib
    import json

    passed = {"PIP_INDEX_URL": "https://user:secret@index.example/simple"}
    monkeypatch.setenv("RETCON_SANDBOX_NOTES_KEY", "9c4e1f7a0b3d8e25c6f14a9b7d02e8c3f5a1b6d4")
    first = LocalBackend(passed).environment()
    env = {"PATH": os.environ.get("PATH", ""), **passed}
    plain = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()
    assert plain[:16] not in first
    assert LocalBackend(passed).environment() == first
    assert LocalBackend({"PIP_INDEX_URL": "other"}).environment() != first
    assert LocalBackend({"PIP_EXTRA": passed["PIP_INDEX_URL"]}).environment() != first
    monkeypatch.setenv("RETCON_SANDBOX_NOTES_KEY", "3e8b5a1f9d2c7e04b6a83f1d5c9e27b0a4d6f8c1")
    assert LocalBackend(passed).environment() != first


def test_a_warmed_sandbox_holds_its_tree_and_goes_when_closed(tmp_path: Path) -> None:
    """`warm`: the tree is read here, the sandbox opened in a thread; `take` waits for it."""
    repo = Repo.init(tmp_path / "repo")
    sha = repo.commit_files("main", {"app.py": "x = 1\n", "lib/util.py": "y = 2\n"}, "base")
    policy = hostaccess.from_command_line([], False, "registries", [], hostaccess.SETUP_DISK,
                                          hostaccess.KEEP_ENVIRONMENTS).setup
    envs = Environments(repo, LocalBackend(), DEFAULTS, policy, JsonReporter(io.StringIO()), sha)
    warming = envs.warm("t", repo.tree_of(sha))
    assert warming is not None and warming.tree == repo.tree_of(sha)
    opened = warming.take()
    assert opened.files == 2 and "y = 2" in opened.box.read_file("lib/util.py").text
    warming.close()
    warming.close()  # once is enough, twice is harmless
    with pytest.raises((RetconError, ValueError)):  # the local helper's pipes are closed
        opened.box.read_file("app.py")


@pytest.mark.parametrize(("args", "expected", "left"), [
    (["--git", "--tag", "v1", "--distance", "3", "--run", "60", "make"], (True, "v1", 3, 0),
     ["--run", "60", "make"]),
    (["--git", "--index", "80", "--tag", "--index", "--run", "60", "make"],
     (True, "--index", 0, 80), ["--run", "60", "make"]),
    (["--tag", "--run", "--run", "60", "make"], (False, "--run", 0, 0), ["--run", "60", "make"]),
    (["--git", "--tag", "--git"], (True, "--git", 0, 0), []),
    ([], (False, None, 0, 0), [])])
def test_the_supervisor_reads_prepare_options_in_order_and_a_tag_as_a_name(
        args: list[str], expected: tuple[bool, str | None, int, int], left: list[str]) -> None:
    """A tag is the repository's name, whatever it is: never read as an option or as the
    command that follows (`--prepare ... --run TIMEOUT COMMAND`, one exec)."""
    supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")
    assert supervisor.prepare_options(args) == expected
    assert args == left


@pytest.mark.parametrize(("held", "ended", "seconds", "failed", "output"), [
    (b"retcon-sandbox-prepared 0 1.250 \n", True, 1.25, [], b""),
    (b"retcon-sandbox-prepared 128 0.5 " + b"no room".hex().encode() + b"\n", True, 0.5,
     [(128, "no room")], b""),
    (b"Traceback (most recent call last): ...\n", True, 0.0,
     [(127, "the supervisor did not say why")], b"Traceback (most recent call last): ...\n"),
    (b"retcon-sandbox-prepared 0 nan zz\n", True, 0.0, [(127, "the supervisor did not say why")],
     b"retcon-sandbox-prepared 0 nan zz\n"),
    # killed, or its container gone, before a record: its exit code says so, not a warning
    (b"", False, 0.0, [], b""),
    (b"retcon-sandbox-prepared 128 0.5 " + b"no room".hex().encode() + b"\n", False, 0.5,
     [(128, "no room")], b"")])
def test_a_prepare_in_a_commands_exec_is_read_from_the_supervisors_stderr(
        held: bytes, ended: bool, seconds: float, failed: list[tuple[int, str]], output: bytes
        ) -> None:
    """Its time is taken off the command's, a failure is reported with its reason, and
    anything else on that stream (the supervisor's own failure) joins the output."""
    from retcon_sandbox.backends.docker.sandboxes import PrepareFirst
    from retcon_sandbox.protocol import OutputCapture

    said: list[tuple[int, str]] = []
    capture = OutputCapture()
    first = PrepareFirst(["--prepare", "--git"], lambda code, why: said.append((code, why)))
    assert first.said(held, capture, ended) == seconds
    assert said == failed
    assert capture.text().encode() == output


def test_the_host_and_the_supervisor_agree_on_what_they_share() -> None:
    """The supervisor runs in the container from its own file: the host's copies of its exit
    code on a timeout, its record's name and its time limit for the git metadata must match."""
    from retcon_sandbox.backends.docker import sandboxes

    supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")
    assert sandboxes.TIMED_OUT == supervisor.TIMED_OUT
    assert supervisor.PREPARED_RECORD.encode() == sandboxes.PREPARED_RECORD
    assert sandboxes.PREPARE_S == supervisor.PREPARE_S


def test_a_result_kept_with_the_git_metadata_made_before_is_not_reused(tmp_path: Path) -> None:
    """A sandbox opened ahead kept the previous tree's git metadata, and its verdict was kept as
    the user's own: the git metadata's version is in the cache's key, so it is not reused."""
    repo = Repo.init(tmp_path / "repo")
    repo.commit_files("main", {"a": "1\n"}, "base")

    def described(settings: SandboxSettings) -> str:
        return Environments(repo, LocalBackend(), settings, hostaccess.HostAccess().setup,
                            JsonReporter(io.StringIO()), "main").describe()

    assert described(DEFAULTS) != " setup:b5261ac2f7f534a6"  # 0.3.0's key for these settings
    assert described(DEFAULTS.replace(git_metadata=False)) == " setup:7cb94c9ce1ec435c"
    # what keys a setup is no part of it without a setup: a new default keeps the results
    assert described(DEFAULTS.replace(setup_inputs=["x.lock"])) == described(DEFAULTS)
    with_setup = DEFAULTS.replace(setup="pip install six")
    assert described(with_setup.replace(setup_inputs=["x.lock"])) != described(with_setup)


def test_a_preflight_stamp_is_kept_and_never_written_through_a_symlink(tmp_path: Path) -> None:
    from retcon_sandbox.spec import statedir
    from retcon_sandbox.spec.statedir import STAMPS_FILE, StateDir

    state = StateDir(tmp_path)
    assert not state.has_stamp("a" * 64)
    state.add_stamp("a" * 64)
    state.add_stamp("b" * 64)
    assert state.has_stamp("a" * 64) and state.has_stamp("b" * 64)
    assert not state.has_stamp("a" * 63)  # whole lines only
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("c" * 64 + "\n")
    other = StateDir(tmp_path / "other")
    (tmp_path / "other").mkdir()
    os.symlink(elsewhere, other.ensure() / STAMPS_FILE)
    assert not other.has_stamp("c" * 64)  # a planted symlink is never read
    other.add_stamp("d" * 64)
    assert elsewhere.read_text() == "c" * 64 + "\n"  # nor written through
    full = StateDir(tmp_path / "full")
    (tmp_path / "full").mkdir()
    (full.ensure() / STAMPS_FILE).write_bytes(b"0" * statedir.STAMPS_LIMIT)
    full.add_stamp("e" * 64)  # a file grown to the limit starts over
    assert full.has_stamp("e" * 64)
