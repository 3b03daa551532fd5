"""What a setup reads of the tree, for the commands whose reads are known: the environment is
keyed on exactly those files; any other command keeps the conservative keying."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import pytest

from retcon_sandbox.backends.envkeys import environment_key, keyed_inputs
from retcon_sandbox.backends.setupreads import known_reads
from retcon_sandbox.repo.gitrepo import TreeEntry
from retcon_sandbox.spec.settings import SandboxSettings


def tree(**files: str) -> tuple[dict[str, TreeEntry], dict[str, bytes]]:
    """Entries and their blobs: each file's text is its own blob id's content."""
    entries: dict[str, TreeEntry] = {}
    blobs: dict[str, bytes] = {}
    for name, text in files.items():
        path = name.replace("__", "/").replace("_dot_", ".").replace("_dash_", "-")
        sha = hashlib.sha1(text.encode()).hexdigest()  # as git's: parts are cached by blob
        entries[path] = TreeEntry("100644", sha)
        blobs[sha] = text.encode()
    return entries, blobs


PROJECT = dict(pyproject_dot_toml='[project]\nname = "p"\ndependencies = ["six"]\n',
               setup_dot_py="import setuptools\n", src__p_dot_py="x = 1\n",
               requirements_dot_txt="six==1.16.0\n-r requirements/base.txt\n",
               requirements__base_dot_txt="iniconfig>=2 ; python_version >= '3.8'  # ok\n"
                                         "pytest --hash=sha256:ab12\n",
               docs__requirements_dot_txt="sphinx\n")


def reads(command: str, **files: str) -> set[str] | None:
    entries, blobs = tree(**(files or PROJECT))
    found = known_reads((command,), entries, blobs.get)
    return None if found is None else set(found)


@pytest.mark.parametrize(("command", "expected"), [
    ("pip install freezegun", set()),
    ("pip3 install -U 'pytest>=8' \"coverage[toml]==7.1\" six~=1.16 --no-deps -q", set()),
    ("pip install --upgrade pip && pip install freezegun", set()),
    ("pip install -i https://pypi.org/simple/ --only-binary :all: six", set()),
    ("pip install -r requirements.txt", {"requirements.txt", "requirements/base.txt"}),
    ("pip install -rrequirements/base.txt six", {"requirements/base.txt"}),
])
def test_a_pip_install_by_name_reads_only_its_requirements_files(command: str,
                                                                 expected: set[str]) -> None:
    assert reads(command) == expected


@pytest.mark.parametrize("command", [
    "pip install -e .", "pip install .", "pip install ./src", "pip install -e .[tests]",
    "python -m pip install six",  # the workspace is first on sys.path: a tracked pip/ runs
    "python3 -m pip install six", "pip install six>=1",  # a redirection
    "pip install pkg[extra]",  # an unquoted glob: a tracked `pkge` would match it
    "pip install dist/pkg-1.0.whl", "pip install pkg.tar.gz",
    "pip install 'pkg @ https://example.com/pkg.whl'", "pip install https://x.org/a.whl",
    "pip install $PKG", "pip install six; ./run.sh", "pip install six | tee log",
    "pip install -f wheels six", "pip install --find-links=wheels six",
    "pip install -i ./index six", "pip install --target vendor six",
    "pip install -r missing.txt", "pip install -r ../outside.txt", "pip install -r /etc/x",
    "pip download six", "uv pip install six", "uv sync", "sh setup.sh",
    "FOO=1 pip install six", "./pip install six", "pip install 'six' && ./x",
])
def test_any_other_command_is_not_classified(command: str) -> None:
    assert reads(command) is None


@pytest.mark.parametrize("line", [
    "-e .", ".", "./src", "-e git+https://example.com/x.git#egg=x", "x @ file:///tmp/x",
    "${HOME}/x", "--find-links wheels", "-r ../../up.txt", "pkg --install-option=--x",
    "https://example.com/x.whl", "dist/x.whl",
])
def test_a_requirements_file_that_names_another_file_or_the_project_is_not(line: str) -> None:
    assert reads("pip install -r r.txt", r_dot_txt=f"six\n{line}\n", x_dot_py="") is None


def test_a_requirements_file_may_name_others_but_a_cycle_ends() -> None:
    assert reads("pip install -r a.txt", a_dot_txt="-r sub/b.txt\nsix\n",
                 sub__b_dot_txt="-c ../a.txt\n-r c.txt\n", sub__c_dot_txt="pytest\n") == \
        {"a.txt", "sub/b.txt", "sub/c.txt"}


LOCK = {"name": "shop", "lockfileVersion": 3,
        "packages": {"": {"name": "shop"}, "node_modules/left-pad": {"version": "1.3.0"},
                     "node_modules/a/node_modules/b": {"version": "2.0.0"}}}


def npm(package: Mapping[str, object], lock: Mapping[str, object], command: str = "npm ci",
        **more: str) -> set[str] | None:
    return reads(command, package_dot_json=json.dumps(package),
                 package_dash_lock_dot_json=json.dumps(lock), index_dot_js="", **more)


def test_npm_ci_reads_the_package_its_lock_and_npmrc() -> None:
    assert npm({"name": "shop"}, LOCK) == {"package.json", "package-lock.json"}
    assert npm({"name": "shop"}, LOCK, _dot_npmrc="x=1\n", web__package_dot_json="{}") == \
        {"package.json", "package-lock.json", ".npmrc"}
    scripts = {"name": "shop", "scripts": {"postinstall": "node build.js", "test": "x"}}
    assert npm(scripts, LOCK) is None  # an install script may read anything
    assert npm(scripts, LOCK, "npm ci --ignore-scripts") == {"package.json",
                                                             "package-lock.json"}
    assert npm({"name": "shop", "scripts": {"test": "node t.js"}}, LOCK) is not None
    assert npm({"name": "shop", "workspaces": ["web"]}, LOCK) is None
    linked = {**LOCK, "packages": {**LOCK["packages"], "web": {"version": "1.0.0"}}}  # type: ignore[dict-item]
    assert npm({"name": "shop"}, linked) is None
    local = {**LOCK, "packages": {"": {}, "node_modules/x": {"resolved": "file:../x"}}}
    assert npm({"name": "shop"}, local) is None
    assert npm({"name": "shop"}, {"lockfileVersion": 1, "dependencies": {
        "x": {"version": "file:vendor/x"}}}) is None
    assert npm({"name": "shop"}, LOCK, "npm install") is None
    assert reads("npm ci", package_dot_json="{}") is None  # no lock: npm ci refuses anyway


def test_cargo_fetch_with_a_lock_reads_the_manifests_the_lock_and_cargo_config() -> None:
    files = dict(Cargo_dot_toml="[package]\n", Cargo_dot_lock="", build_dot_rs="",
                 crates__core__Cargo_dot_toml="", _dot_cargo__config_dot_toml="",
                 src__lib_dot_rs="", pyproject_dot_toml="")
    assert reads("cargo fetch", **files) == {"Cargo.toml", "Cargo.lock",
                                             "crates/core/Cargo.toml", ".cargo/config.toml"}
    assert reads("cargo fetch --locked --target x86_64-unknown-linux-gnu", **files)
    without_lock = {k: v for k, v in files.items() if k != "Cargo_dot_lock"}
    assert reads("cargo fetch", **without_lock) is None
    assert reads("cargo fetch --manifest-path sub/Cargo.toml", **files) is None
    assert reads("cargo build", **files) is None


def key(command: str, files: dict[str, str], chosen: tuple[str, ...] | None = None) -> str:
    entries, blobs = tree(**files)
    settings = SandboxSettings.parse({"setup": command, **(
        {"setup_inputs": list(chosen)} if chosen is not None else {})})
    fingerprint, known = keyed_inputs(entries, settings, None, blobs.get)
    return environment_key("sha256:1", settings.setup, True, None, fingerprint, "repo", known)


def test_a_manifest_change_prepares_nothing_for_a_setup_that_does_not_read_it() -> None:
    """itsdangerous with `pip install freezegun`: pyproject.toml's dependency groups, tox table
    and uv.lock changed, and each commit prepared an environment of its own."""
    before = {**PROJECT, "uv_dot_lock": "a"}
    after = {**PROJECT, "uv_dot_lock": "b", "pyproject_dot_toml":
             '[project]\nname = "p"\ndependencies = ["six", "click"]\n[tool.tox]\nx = 1\n'}
    assert key("pip install freezegun", before) == key("pip install freezegun", after)
    assert key("pip install -e .", before) != key("pip install -e .", after)  # reads it
    requirements = "pip install -r requirements.txt"
    assert key(requirements, before) == key(requirements, after)
    bumped = {**after, "requirements__base_dot_txt": "iniconfig>=2\npytest>=8\n"}
    assert key(requirements, after) != key(requirements, bumped)
    # the spec's own setup_inputs are what it keys on, whatever the command
    assert key("pip install freezegun", before, ("uv.lock",)) != \
        key("pip install freezegun", after, ("uv.lock",))


def test_cargo_fetch_keys_what_cargo_reads_not_the_build_script() -> None:
    base = dict(Cargo_dot_toml='[package]\nname = "d"\nversion = "0.1.0"\n[dependencies]\n',
                Cargo_dot_lock='version = 3\n[[package]]\nname = "d"\nversion = "0.1.0"\n',
                build_dot_rs="fn main() {}\n", src__lib_dot_rs="")
    same = key("cargo fetch", base)
    assert key("cargo fetch", {**base, "build_dot_rs": "fn main() { x() }\n"}) == same
    assert key("cargo fetch", {**base, "pyproject_dot_toml": "[project]\n"}) == same
    bumped = {**base, "Cargo_dot_toml": base["Cargo_dot_toml"].replace("0.1.0", "0.2.0"),
              "Cargo_dot_lock": base["Cargo_dot_lock"].replace("0.1.0", "0.2.0")}
    assert key("cargo fetch", bumped) == same  # the crate's own version fetches nothing
    added = {**base, "Cargo_dot_toml": base["Cargo_dot_toml"] + 'itoa = "1"\n'}
    assert key("cargo fetch", added) != same
    assert key("cargo build", {**base, "build_dot_rs": "x"}) != key("cargo build", base)


# --- what a review found (each kept a stale environment: one key for two installs) ----------


@pytest.mark.parametrize("command", [
    "pip install poetry\npoetry install",  # sh runs two commands; shlex read one
    "pip install -U pip\r\nmake deps",
    "pip install 'pkg-1.0-py3-none-any.w'hl",  # one word for sh: the tracked wheel
    "pip install a'b'", 'pip install "six"x',
    "pip install 'pkg-1.0-py3-none-any.whl[x]'",  # pip installs a tracked archive by name
    "pip install pkg-1.0.tar.lzma",
    "pip install -r=requirements.txt",  # optparse reads the file `=requirements.txt`
    "pip install -r sub/../requirements.txt",  # `sub` may be a link: `..` leaves its target
    "pip install six==1.0.zip",  # a tracked file, for pip, when it ends as an archive does
    "pip install six \u00a0",  # a no-break space is a word for sh and shlex, not a name
])
def test_what_the_shell_or_pip_reads_otherwise_is_not_classified(command: str) -> None:
    assert reads(command) is None


@pytest.mark.parametrize("text", [
    "six\n# C:\\tools\\\n./local\n",  # a comment line ends no continuation: ./local is read
    "six\n  # note \\\n-e .\n",
    "-r\u00a0base.txt\n",  # pip splits on spaces only: it reads the file `\u00a0base.txt`
    "-r 'a b.txt'\n",  # and its option lines through shlex: the file `a b.txt`
    "# -*- coding: utf-7 -*-\nsix==1+AAo-.+AC8-local\n",  # decoded as declared: `./local`
    "six==1.0.zip\n",
    "six \\\n# c\n--hash=sha256:ab12\n",  # a line of hashes alone, once the comment broke it
])
def test_a_requirements_file_is_read_as_pip_reads_it(text: str) -> None:
    assert reads("pip install -r r.txt", r_dot_txt=text, base_dot_txt="six\n") is None


def test_what_pip_joins_and_a_utf8_cookie_stay_classified() -> None:
    assert reads("pip install six\n") == set()  # a TOML multi-line string's last new line
    assert reads("pip install backports.lzma") == set()  # pip's archive is `.tar.lzma`
    assert reads("pip install -r r.txt", r_dot_txt="six\\\n==1.16.0\npytest  # a note \\\n",
                 base_dot_txt="") == {"r.txt"}
    assert reads("pip install -r r.txt", r_dot_txt="# coding: utf-8\nsix\n") == {"r.txt"}


def test_npm_ci_is_not_classified_when_anything_runs_at_install() -> None:
    scripted = {**LOCK, "packages": {**LOCK["packages"], "node_modules/@prisma/client": {  # type: ignore[dict-item]
        "version": "5.0.0", "hasInstallScript": True}}}
    assert npm({"name": "shop"}, scripted) is None  # its postinstall reads prisma/schema.prisma
    assert npm({"name": "shop"}, scripted, "npm ci --ignore-scripts") == \
        {"package.json", "package-lock.json"}
    assert npm({"name": "shop"}, LOCK, binding_dot_gyp="{}") is None  # npm runs node-gyp
    assert npm({"name": "shop", "gypfile": False}, LOCK, binding_dot_gyp="{}") is not None
    assert npm({"name": "shop"}, {"lockfileVersion": 1, "dependencies": {
        "x": {"version": "1.0.0"}}}) is None  # a version 1 lock does not say what runs


def linked_key(command: str, files: Mapping[str, str], links: Mapping[str, str]) -> str:
    """key() for a tree with symbolic links (path -> target)."""
    entries, blobs = tree(**files)
    for path, target in links.items():
        sha = hashlib.sha1(b"link " + target.encode()).hexdigest()
        entries[path] = TreeEntry("120000", sha)
        blobs[sha] = target.encode()
    settings = SandboxSettings.parse({"setup": command})

    def link(entry: TreeEntry) -> str:
        return blobs[entry.sha].decode()
    fingerprint, known = keyed_inputs(entries, settings, link, blobs.get)
    return environment_key("sha256:1", settings.setup, True, None, fingerprint, "repo", known)


def test_a_file_an_installer_reads_through_a_link_keys_with_its_target() -> None:
    package = dict(package_dot_json='{"name": "shop"}', package_dash_lock_dot_json=json.dumps(LOCK))
    npmrc = {".npmrc": "cfg/npmrc"}
    assert reads("npm ci", **package, cfg__npmrc="") is not None
    assert linked_key("npm ci", {**package, "cfg__npmrc": ""}, npmrc) != \
        linked_key("npm ci", {**package, "cfg__npmrc": "omit=dev\n"}, npmrc)
    crate = dict(Cargo_dot_toml="[package]\n", ci__lock="version = 3\n")
    cargo_dir = {".cargo": "ci/cargo"}  # a folder as a link: cargo reads its config
    locked = {**crate, "Cargo_dot_lock": "", "ci__cargo__config_dot_toml": "a"}
    entries, blobs = tree(**locked)
    entries[".cargo"] = TreeEntry("120000", "0" * 40)
    assert known_reads(("cargo fetch",), entries, blobs.get) is None
    assert linked_key("cargo fetch", locked, cargo_dir) != linked_key(
        "cargo fetch", {**locked, "ci__cargo__config_dot_toml": "b"}, cargo_dir)
    assert linked_key("cargo fetch", crate, {"Cargo.lock": "ci/lock"}) != \
        linked_key("cargo fetch", {**crate, "ci__lock": "version = 4\n"}, {"Cargo.lock": "ci/lock"})


def test_the_conservative_keying_holds_what_installers_read_besides_manifests() -> None:
    husky = dict(package_dot_json='{"name": "a", "scripts": {"prepare": "husky"}}',
                 package_dash_lock_dot_json=json.dumps(LOCK))
    assert key("npm ci", husky) != key("npm ci", {**husky, "_dot_npmrc": "omit=dev\n"})
    crate = dict(Cargo_dot_toml='[package]\nname = "d"\n[dependencies]\nitoa = "1"\n')
    assert key("cargo fetch", crate) != key("cargo fetch", {
        **crate, "_dot_cargo__config_dot_toml": "[patch.crates-io]\nitoa = { path = 'x' }\n"})
    gyp = {**husky, "binding_dot_gyp": "{'targets': [{'sources': ['addon.cc']}]}",
           "addon_dot_cc": "A"}
    assert key("npm ci", gyp) != key("npm ci", {**gyp, "addon_dot_cc": "B"})
    wheel = "pip install 'pkg-1.0-py3-none-any.whl[x]'"
    assert key(wheel, {"pkg_dash_1_dot_0_dash_py3_dash_none_dash_any_dot_whl": "A"}) != \
        key(wheel, {"pkg_dash_1_dot_0_dash_py3_dash_none_dash_any_dot_whl": "B"})
