"""What of a manifest keys a prepared environment (pure: blobs are bytes in a dict)."""

from __future__ import annotations

import hashlib

from retcon_sandbox.backends.envkeys import (
    DEFAULT_INPUTS,
    cache_name,
    environment_key,
    inputs,
    setup_files,
    why_new,
)
from retcon_sandbox.backends.manifests import changes, dynamic_files, parts
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import TreeEntry

PYPROJECT = b"""\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "app"
version = "1.0"
dependencies = ["six==1.16.0"]

[project.optional-dependencies]
test = ["pytest"]

[tool.ruff]
line-length = 100
"""
CARGO = b"""\
[package]
name = "app"
version = "0.1.0"

[dependencies]
serde = "1"

[target.'cfg(unix)'.dependencies]
libc = "0.2"

[lints.rust]
unsafe_code = "forbid"
"""
CARGO_LOCK = b"""\
version = 3

[[package]]
name = "app"
version = "0.1.0"
dependencies = ["serde"]

[[package]]
name = "serde"
version = "1.0.1"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "aa"
"""


class Blobs:
    """A tree of files held as bytes, keyed like git (by a digest of their content)."""

    def __init__(self, **files: bytes) -> None:
        self.data: dict[str, bytes] = {}
        self.tree: dict[str, TreeEntry] = {}
        for name, content in files.items():
            self.put(name.replace("__", "/").replace("_dot_", "."), content)

    def put(self, path: str, content: bytes) -> Blobs:
        sha = hashlib.sha1(content).hexdigest()
        self.data[sha] = content
        self.tree[path] = TreeEntry("100644", sha)
        return self

    def edited(self, path: str, old: bytes, new: bytes) -> Blobs:
        copy = Blobs()
        copy.data, copy.tree = dict(self.data), dict(self.tree)
        content = self.data[self.tree[path].sha]
        assert old in content
        return copy.put(path, content.replace(old, new))

    def key(self, setup: tuple[str, ...] = ("pip install -e .",)) -> str:
        found = inputs(self.tree, Patterns(DEFAULT_INPUTS), setup, None, self.data.get)
        return environment_key("sha256:1", setup, True, None, found)


def test_a_lint_rule_or_a_version_bump_prepares_nothing() -> None:
    tree = Blobs(pyproject_dot_toml=PYPROJECT, Cargo_dot_toml=CARGO, Cargo_dot_lock=CARGO_LOCK)
    same = tree.key()
    assert tree.edited("pyproject.toml", b"line-length = 100", b"line-length = 88").key() == same
    assert tree.edited("pyproject.toml", b'version = "1.0"', b'version = "1.1"').key() == same
    bumped = tree.edited("Cargo.toml", b'version = "0.1.0"', b'version = "0.2.0"')
    bumped = bumped.edited("Cargo.lock", b'version = "0.1.0"', b'version = "0.2.0"')
    assert bumped.key() == same  # the crate's own version, in the manifest and the lock file
    assert tree.edited("Cargo.toml", b"unsafe_code", b"missing_docs").key() == same
    msrv = tree.edited("Cargo.toml", b'version = "0.1.0"',
                       b'version = "0.1.0"\nrust-version = "1.74"')
    assert msrv.key() == same  # hexyl's MSRV bumps prepared an environment each


def test_what_changes_an_install_prepares_again() -> None:
    tree = Blobs(pyproject_dot_toml=PYPROJECT, Cargo_dot_toml=CARGO, Cargo_dot_lock=CARGO_LOCK)
    same = tree.key()
    for path, old, new in [
        ("pyproject.toml", b"six==1.16.0", b"six==1.17.0"),
        ("pyproject.toml", b'test = ["pytest"]', b'test = ["pytest", "hypothesis"]'),
        ("pyproject.toml", b"setuptools>=68", b"setuptools>=69"),
        ("pyproject.toml", b"[tool.ruff]", b'[dependency-groups]\ndev = ["x"]\n[tool.ruff]'),
        ("pyproject.toml", b"[tool.ruff]", b'[tool.poetry.dependencies]\nx = "1"\n[tool.ruff]'),
        ("Cargo.toml", b'serde = "1"', b'serde = "1"\nrand = "0.8"'),
        ("Cargo.toml", b'libc = "0.2"', b'libc = "0.3"'),
        ("Cargo.toml", b"[lints.rust]", b'[patch.crates-io]\nserde = { path = "x" }\n[lints.rust]'),
        ("Cargo.lock", b'version = "1.0.1"', b'version = "1.0.2"'),  # a registry package
        # what chooses the code setup runs, in tables no list of "dependency tables" names
        ("pyproject.toml", b"[tool.ruff]",
         b'[tool.setuptools.cmdclass]\nbuild_py = "x:Hook"\n[tool.ruff]'),
        ("pyproject.toml", b"[tool.ruff]",
         b'[tool.hatch.build.hooks.custom]\npath = "hook.py"\n[tool.ruff]'),
        ("pyproject.toml", b"[tool.ruff]", b'[tool.maturin]\nfeatures = ["x"]\n[tool.ruff]'),
        ("pyproject.toml", b'name = "app"', b'name = "app"\nreadme = "README.md"'),
        ("Cargo.toml", b'version = "0.1.0"', b'version = "0.1.0"\nbuild = "gen.rs"'),
        ("Cargo.toml", b'version = "0.1.0"', b'version = "0.1.0"\nlinks = "z"'),
        ("Cargo.toml", b"[lints.rust]", b'[profile.dev]\nopt-level = 3\n[lints.rust]'),
    ]:
        assert tree.edited(path, old, new).key() != same, (path, new)


def test_a_manifest_that_is_not_toml_is_keyed_on_its_whole_content() -> None:
    broken = Blobs(pyproject_dot_toml=b"[project\ndependencies = [\n")
    assert broken.edited("pyproject.toml", b"[project", b"[projekt").key() != broken.key()
    deep = Blobs(pyproject_dot_toml=b"x = " + b"[" * 100_000)
    assert parts("pyproject.toml", "100644", "s", lambda _: b"x = " + b"[" * 100_000) == {
        "": "100644 s"}
    assert deep.key()  # no crash
    assert parts("pyproject.toml", "100644", "s", lambda _: None) == {"": "100644 s"}  # large
    assert parts("pyproject.toml", "120000", "s", lambda _: PYPROJECT) == {"": "120000 s"}


def test_a_hostile_manifest_is_keyed_whole_quickly_and_never_crashes() -> None:
    """Dotted keys nested thousands deep parse, then cannot be digested (recursion), and are
    slow to parse at all: such a file is keyed on its whole content."""
    deep = b"[project]\nname = 'a'\n[tool]\n" + b".".join([b"k"] * 3000) + b" = 1\n"
    assert parts("pyproject.toml", "100644", "d1", lambda _: deep) == {"": "100644 d1"}
    nested = b"[dependencies]\nx = " + b"{a = " * 900 + b"1" + b"}" * 900 + b"\n"
    assert parts("Cargo.toml", "100644", "d2", lambda _: nested) == {"": "100644 d2"}
    tree = Blobs(pyproject_dot_toml=deep)
    assert tree.key() != tree.edited("pyproject.toml", b"= 1", b"= 2").key()


def test_every_file_a_setup_command_names_is_keyed_whatever_its_scripts_name() -> None:
    """The names a long script gives never push out the ones the commands give."""
    script = b"".join(b"cp tools/f%d.cfg /tmp/x%d\n" % (i, i) for i in range(60))
    tree = Blobs(requirements_dot_txt=b"six\n", scripts__setup_dot_sh=script,
                 **{f"tools/f{i}.cfg": b"x" for i in range(60)})
    setup = ("pip install -r requirements.txt", "sh scripts/setup.sh")
    assert "requirements.txt" in setup_files(setup, tree.tree, None, tree.data.get)
    assert tree.edited("requirements.txt", b"six", b"attrs").key(setup) != tree.key(setup)


def test_files_a_setup_py_or_setup_cfg_names_are_keyed() -> None:
    """`pip install -e .` names no file, but setup.py reads requirements.txt: it keys the
    environment. A directory it names (the code) does not."""
    tree = Blobs(setup_dot_py=b"from setuptools import setup\nsetup(install_requires=open("
                 b"'requirements.txt').read().split(), package_dir={'': 'src'})\n",
                 requirements_dot_txt=b"six\n", **{"src/app/core.py": b"x = 1\n"},
                 lib__setup_dot_cfg=b"[options]\ninstall_requires = file: reqs.txt\n",
                 lib__reqs_dot_txt=b"attrs\n")
    same = tree.key()
    assert tree.edited("requirements.txt", b"six", b"attrs").key() != same
    assert tree.edited("lib/reqs.txt", b"attrs", b"six").key() != same
    assert tree.edited("src/app/core.py", b"1", b"2").key() == same


def test_files_setup_reads_are_followed_and_keyed_whole() -> None:
    tree = Blobs(requirements_dot_txt=b"-r requirements/base.txt\n",
                 requirements__base_dot_txt=b"six==1.16.0\n",
                 docs__requirements_dot_txt=b"sphinx\n", **{"requirements-mypy.txt": b"mypy\n"},
                 scripts__setup_dot_sh=b". scripts/lib.sh\npip install -r requirements.txt\n",
                 scripts__lib_dot_sh=b"true\n")
    script = ("sh scripts/setup.sh",)
    assert setup_files(script, tree.tree, None, tree.data.get) == {
        "scripts/setup.sh", "scripts/lib.sh", "requirements.txt", "requirements/base.txt"}
    same = tree.key(script)
    assert tree.edited("docs/requirements.txt", b"sphinx", b"furo").key(script) == same
    assert tree.edited("requirements-mypy.txt", b"mypy", b"mypy==1").key(script) == same
    assert tree.edited("requirements/base.txt", b"1.16.0", b"1.17.0").key(script) != same
    assert tree.edited("scripts/lib.sh", b"true", b"false").key(script) != same


def test_a_named_manifest_is_keyed_whole_and_setuptools_dynamic_files_count() -> None:
    tree = Blobs(pyproject_dot_toml=PYPROJECT + b'[tool.setuptools.dynamic]\n'
                 b'dependencies = {file = ["deps.txt"]}\n', deps_dot_txt=b"six\n")
    assert dynamic_files(tree.data[tree.tree["pyproject.toml"].sha]) == ["deps.txt"]
    assert tree.edited("deps.txt", b"six", b"attrs").key() != tree.key()
    named = ("python tools/x.py pyproject.toml",)  # a file a command names: keyed in full
    assert tree.edited("pyproject.toml", b"line-length", b"indent-width").key(named) != \
        tree.key(named)


def test_why_a_new_environment_is_made() -> None:
    tree = Blobs(pyproject_dot_toml=PYPROJECT, Cargo_dot_toml=CARGO, requirements_dot_txt=b"a")
    setup = ("pip install -r requirements.txt",)

    def record(blobs: Blobs, commands: tuple[str, ...] = setup) -> dict[str, object]:
        found = inputs(blobs.tree, Patterns(DEFAULT_INPUTS), commands, None, blobs.data.get)
        return {"image": "sha256:1", "setup": list(commands), "git": True, "tag": None,
                "inputs": found}

    first = record(tree)
    assert why_new(None, first) == "first environment for this repository"
    assert why_new(first, record(tree.edited("Cargo.toml", b'serde = "1"', b'serde = "2"'))
                   ) == "Cargo.toml [dependencies] changed"
    assert why_new(first, record(tree.edited("requirements.txt", b"a", b"b"))
                   ) == "requirements.txt changed"
    assert why_new(first, record(tree, ("pip install -r requirements.txt", "true"))
                   ) == "setup commands changed"
    assert why_new(first, record(tree.put("uv.lock", b"version = 1"))) == "uv.lock added"
    assert why_new(first, first) == "the environment of these inputs is no longer kept"
    assert why_new(first, first, fresh=True) == "--no-cache: prepared again"
    assert changes({"a": {"[x]": "1"}}, {"a": {"[x]": "1", "[y]": "2"}}) == ["a [y] added"]


def test_the_package_cache_follows_what_setup_runs_not_what_it_reads() -> None:
    tree = Blobs(requirements_dot_txt=b"six\n", scripts__setup_dot_sh=b"pip install -r "
                 b"requirements.txt\n", app_dot_py=b"x = 1\n")
    script = ("sh scripts/setup.sh",)

    def cache(blobs: Blobs, setup: tuple[str, ...] = script, scope: str = "/r/.git 1",
              source: str = "feature") -> str:
        return cache_name(scope, source, setup, blobs.tree, None, blobs.data.get)

    same = cache(tree)
    assert same.startswith("retcon-sandbox-cache-")
    assert cache(tree.edited("requirements.txt", b"six", b"attrs")) == same  # data: shared
    assert cache(tree.edited("app.py", b"1", b"2")) == same
    assert cache(tree.edited("scripts/setup.sh", b"pip", b"echo x; pip")) != same  # its own
    assert cache(tree, ("sh scripts/setup.sh", "true")) != same
    assert cache(tree, scope="/other/.git 2") != same  # never shared between repositories
    # nor between branches: code a setup runs unnamed (setup.py) could plant what the next
    # setup installs, so another branch's setups never read this one's cache
    assert cache(tree, source="untrusted-pr") != same


def test_what_setup_runs_through_modules_imports_and_install_scripts_is_keyed() -> None:
    """A file setup runs keys the environment however it is reached: `python -m`, an import
    of the script it runs (from the script's folder or the root, relative or not), npm's
    install scripts, a path in quotes or behind `cd` and `..`. Files it never runs do not."""
    tree = Blobs(tools__prep_dot_py=b"import helper\nfrom lib.util import x\nfrom . import z\n",
                 tools__helper_dot_py=b"X = 1\n", lib__util_dot_py=b"x = 1\n",
                 tools__z_dot_py=b"z = 1\n",
                 package_dot_json=b'{"scripts": {"postinstall": "node scripts/post.js", '
                                  b'"test": "node t.js"}}',
                 scripts__post_dot_js=b"p = 1\n", t_dot_js=b"t = 1\n", src__app_dot_py=b"a = 1\n",
                 **{"a/my dir/s.sh": b"s = 1\n", "a/b/c.sh": b"c = 1\n"})
    runs = [
        ("python3 -m tools.prep", "tools/helper.py"),
        ("python3 -m tools.prep", "lib/util.py"),
        ("python3 tools/prep.py", "tools/helper.py"),
        ("python3 tools/prep.py", "tools/z.py"),
        ("npm ci", "scripts/post.js"),
        ("sh 'a/my dir/s.sh'", "a/my dir/s.sh"),
        ("cd tools && sh ../a/b/c.sh", "a/b/c.sh"),
    ]
    for command, path in runs:
        setup = (command,)
        assert tree.edited(path, b"1", b"2").key(setup) != tree.key(setup), (command, path)
        for unrelated in ("src/app.py", "t.js"):
            assert tree.edited(unrelated, b"1", b"2").key(setup) == tree.key(setup), \
                (command, unrelated)


def test_a_tox_table_keys_the_environment() -> None:
    tree = Blobs(pyproject_dot_toml=PYPROJECT + b'[tool.tox]\nenv_list = ["py311"]\n')
    assert tree.edited("pyproject.toml", b"py311", b"py312").key(("tox --notest",)) != \
        tree.key(("tox --notest",))
