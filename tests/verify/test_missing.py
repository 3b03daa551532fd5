"""The missing-dependency patterns over real outputs: each copied from a run in the sandbox
images (retcon-sandbox/base: python 3.11, pytest 7.2; retcon-sandbox/rust: cargo 1.85;
retcon-sandbox/node) or, where marked, on a host with cargo 1.95 / node 20."""

from __future__ import annotations

import pytest

from retcon_sandbox.errors import ConfigError
from retcon_sandbox.verify.missing import Missing, find, judge, recipe

PYTEST = r"""
==================================== ERRORS ====================================
_______________________ ERROR collecting tests/test_a.py _______________________
ImportError while importing test module '/w/tests/test_a.py'.
Hint: make sure your test modules/packages have valid Python names.
Traceback:
/usr/lib/python3.11/importlib/__init__.py:126: in import_module
    return _bootstrap._gcd_import(name[level:], package, level)
tests/test_a.py:1: in <module>
    import requests
E   ModuleNotFoundError: No module named 'requests'
=========================== short test summary info ============================
ERROR tests/test_a.py
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
1 error in 0.09s
"""
DASH_M = r"""/opt/venv/bin/python: No module named nosuchmod
"""
SCRIPT = r"""Traceback (most recent call last):
  File "/w/b.py", line 1, in <module>
    import yaml.foo
ModuleNotFoundError: No module named 'yaml'
"""
CARGO_OFFLINE = r"""error: no matching package named `serde` found
location searched: crates.io index
required by package `bc_rs v0.1.0 (/tmp/w)`
As a reminder, you're using offline mode (--offline) which can sometimes cause surprising resolution failures, if this error is too confusing you may wish to retry without the offline flag.
"""
CARGO_NO_NETWORK = r"""    Updating crates.io index
warning: spurious network error (3 tries remaining): [6] Couldn't resolve host name (Could not resolve host: index.crates.io)
warning: spurious network error (2 tries remaining): [6] Couldn't resolve host name (Could not resolve host: index.crates.io)
warning: spurious network error (1 tries remaining): [6] Couldn't resolve host name (Could not resolve host: index.crates.io)
error: failed to get `serde` as a dependency of package `bc_rs v0.1.0 (/tmp/w)`

Caused by:
  download of config.json failed

Caused by:
  failed to download from `https://index.crates.io/config.json`

Caused by:
  [6] Couldn't resolve host name (Could not resolve host: index.crates.io)
"""
# host cargo, a registry cache without that version
CARGO_SELECT = r"""error: failed to select a version for the requirement `serde = "=1.0.999"`
candidate versions found which didn't match: 1.0.229
location searched: crates.io index
required by package `bc_rs v0.1.0 (/tmp/bc_rs)`
As a reminder, you're using offline mode (--offline) which can sometimes cause surprising resolution failures, if this error is too confusing you may wish to retry without `--offline`.
"""
# host cargo
CARGO_DOWNLOAD = r"""     Locking 1 package to latest compatible version
      Adding serde v1.0.100 (available: v1.0.229)
error: failed to download `serde v1.0.100`

Caused by:
  attempting to make an HTTP request, but --offline was specified
"""
# host rustc
RUSTC_E0463 = r"""error[E0463]: can't find crate for `serde`
 --> /tmp/e.rs:1:1
  |
1 | extern crate serde;
  | ^^^^^^^^^^^^^^^^^^^ can't find crate

error: aborting due to 1 previous error

For more information about this error, try `rustc --explain E0463`.
"""
# host cargo: a crate Cargo.toml does not declare
CARGO_UNLINKED = r"""   Compiling bc_rs v0.1.0 (/tmp/bc_rs)
error[E0432]: unresolved import `serde`
 --> src/main.rs:1:5
  |
1 | use serde::Serialize;
  |     ^^^^^ use of unresolved module or unlinked crate `serde`
  |
  = help: if you wanted to use a crate named `serde`, use `cargo add serde` to add it to your `Cargo.toml`

For more information about this error, try `rustc --explain E0432`.
error: could not compile `bc_rs` (bin "bc_rs") due to 1 previous error
"""
# host node 20
NODE_CJS = r"""node:internal/modules/cjs/loader:1210
  throw err;
  ^

Error: Cannot find module 'lodash'
Require stack:
- /tmp/bc_js/a.js
    at Module._resolveFilename (node:internal/modules/cjs/loader:1207:15)
    at Module._load (node:internal/modules/cjs/loader:1038:27)
    at Module.require (node:internal/modules/cjs/loader:1289:19)
    at require (node:internal/modules/helpers:182:18)
    at Object.<anonymous> (/tmp/bc_js/a.js:1:11)
    at Module._compile (node:internal/modules/cjs/loader:1521:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)
    at Module.load (node:internal/modules/cjs/loader:1266:32)
    at Module._load (node:internal/modules/cjs/loader:1091:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12) {
  code: 'MODULE_NOT_FOUND',
  requireStack: [ '/tmp/bc_js/a.js' ]
}

Node.js v20.20.2
"""
NODE_ESM = r"""node:internal/errors:496
    ErrorCaptureStackTrace(err);
    ^

Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'left-pad' imported from /w/b.mjs
    at new NodeError (node:internal/errors:405:5)
    at packageResolve (node:internal/modules/esm/resolve:916:9)
    at moduleResolve (node:internal/modules/esm/resolve:973:20)
    at defaultResolve (node:internal/modules/esm/resolve:1206:11)
    at ModuleLoader.defaultResolve (node:internal/modules/esm/loader:404:12)
    at ModuleLoader.resolve (node:internal/modules/esm/loader:373:25)
    at ModuleLoader.getModuleJob (node:internal/modules/esm/loader:250:38)
    at ModuleWrap.<anonymous> (node:internal/modules/esm/module_job:76:39)
    at link (node:internal/modules/esm/module_job:75:36) {
  code: 'ERR_MODULE_NOT_FOUND'
}

Node.js v18.20.4
"""


@pytest.mark.parametrize(("output", "expected"), [
    (PYTEST, Missing("python", "requests", "E   ModuleNotFoundError: No module named 'requests'")),
    (DASH_M, Missing("python", "nosuchmod", "/opt/venv/bin/python: No module named nosuchmod")),
    (SCRIPT, Missing("python", "yaml", "ModuleNotFoundError: No module named 'yaml'")),
    (CARGO_OFFLINE, Missing("rust", "serde", "error: no matching package named `serde` found")),
    (CARGO_NO_NETWORK, Missing("rust", "serde", "error: failed to get `serde` as a dependency "
                                                "of package `bc_rs v0.1.0 (/tmp/w)`")),
    (CARGO_SELECT, Missing("rust", "serde", "error: failed to select a version for the "
                                            'requirement `serde = "=1.0.999"`')),
    (CARGO_DOWNLOAD, Missing("rust", "serde", "error: failed to download `serde v1.0.100`")),
    (RUSTC_E0463, Missing("rust", "serde", "error[E0463]: can't find crate for `serde`")),
    (NODE_CJS, Missing("node", "lodash", "Error: Cannot find module 'lodash'")),
    (NODE_ESM, Missing("node", "left-pad", "Error [ERR_MODULE_NOT_FOUND]: Cannot find package "
                                           "'left-pad' imported from /w/b.mjs")),
])
def test_a_missing_dependency_is_named(output: str, expected: Missing) -> None:
    assert find(output) == expected


@pytest.mark.parametrize("output", [
    CARGO_UNLINKED,  # not declared in Cargo.toml: no setup installs it
    "error[E0463]: can't find crate for `std`\n  = note: the `x86_64-unknown-none` target may "
    "not be installed",
    "Error: Cannot find module './lib/util'\nRequire stack:\n- /w/a.js",
    "FAILED tests/test_a.py::test_x - AssertionError: assert 1 == 2\n1 failed in 0.02s",
    "",
])
def test_other_failures_are_not_a_missing_dependency(output: str) -> None:
    assert find(output) is None


def test_the_first_in_the_output_is_named() -> None:
    assert find(SCRIPT + NODE_CJS) == find(SCRIPT)
    assert find(NODE_CJS + SCRIPT) == find(NODE_CJS)


def test_the_recipe_follows_the_tree() -> None:
    assert "pip install -r requirements.txt" in recipe("python", ["requirements.txt", "a.py"])
    assert "pip install -e .[test]" in recipe("python", ["pyproject.toml", "requirements.txt"])
    assert 'pip install -e ."' in recipe("python", ["setup.py", "src/pyproject.toml"])
    assert "cargo fetch" in recipe("rust", ["Cargo.toml"])
    assert "npm ci" in recipe("node", ["package.json"])


def test_no_setup_is_a_configuration_error_with_the_recipe() -> None:
    verdict = judge(PYTEST, (), ["pyproject.toml", "tests/test_a.py"], "tests")
    assert isinstance(verdict, ConfigError)
    assert "the module 'requests' is not installed" in verdict.message
    assert "the run stops before asking for a fix" in verdict.message
    assert 'setup = ["pip install -e .[test]"]' in verdict.hint
    assert "--no-base-check" in verdict.hint


def test_a_setup_that_does_not_install_it_is_named() -> None:
    verdict = judge(CARGO_OFFLINE, ("cargo fetch",), ["Cargo.toml"], "build")
    assert isinstance(verdict, ConfigError)
    assert verdict.message.startswith("the base commit's build fails: the crate 'serde'")
    assert "[sandbox] setup ran (cargo fetch) but does not install it" in verdict.message


def test_another_failure_is_a_warning_and_a_pass_is_nothing() -> None:
    warning = judge("E   assert 1 == 2\n1 failed in 0.02s\n", (), ["a.py"], "tests")
    assert isinstance(warning, str)
    assert warning.startswith("the base commit's tests already fail (1 failed in 0.02s)")
    assert judge(None, (), ["a.py"], "tests") is None
