"""A missing dependency, read from a failing build or test's output (pure: text in, verdict out).

The base commit is built and tested before the first commit (reconstruct/driver.py,
`preflight`): when it fails because a module, crate or package is not installed, the run stops
with a message naming it and the `[sandbox] setup` recipe that installs it, instead of every
commit failing for the same reason and ending stuck. The patterns are those of real outputs:
Python's `ModuleNotFoundError` (and `python -m X` with X missing), cargo resolving or fetching a
registry dependency offline, rustc's E0463, and node's `Cannot find module` / `Cannot find
package`. An unresolved import of a crate that Cargo.toml does not declare is not one: no setup
installs it (that is the code's own failure).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from retcon_sandbox.errors import ConfigError


@dataclass(frozen=True)
class Missing:
    ecosystem: str  # "python" | "rust" | "node"
    name: str  # the module, crate or package
    line: str  # the line of output that says so


_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("python", re.compile(r"ModuleNotFoundError: No module named '([^'\s]+)'")),
    ("python", re.compile(r"^\S*python[0-9.]*: No module named ([\w.]+)\s*$", re.MULTILINE)),
    ("rust", re.compile(r"error: no matching package named `([^`\s]+)` found")),
    ("rust", re.compile(r"error: failed to select a version for the requirement `([^`\s]+)")),
    ("rust", re.compile(r"error: failed to download `([^`\s]+)")),
    ("rust", re.compile(r"error: failed to get `([^`\s]+)` as a dependency")),
    ("rust", re.compile(r"error\[E0463\]: can't find crate for `([^`\s]+)`")),
    ("node", re.compile(r"Error: Cannot find module '([^'\s]+)'")),
    ("node", re.compile(r"Error \[ERR_MODULE_NOT_FOUND\]: Cannot find package '([^'\s]+)'")),
)
# Not a dependency setup installs: the toolchain's own crates (a target not installed), and a
# node module named by a path (the project's own file).
_NOT_DEPENDENCIES = {"rust": {"std", "core", "alloc", "proc_macro", "test"}}


def find(output: str) -> Missing | None:
    """The first missing dependency the output names (in the order of the output), if any."""
    found: list[tuple[int, Missing]] = []
    for ecosystem, pattern in _PATTERNS:
        for match in pattern.finditer(output):
            name = match.group(1)
            if name in _NOT_DEPENDENCIES.get(ecosystem, ()) or \
                    (ecosystem == "node" and name.startswith((".", "/"))):
                continue
            start = output.rfind("\n", 0, match.start()) + 1
            end = output.find("\n", match.end())
            line = output[start:end if end >= 0 else len(output)].strip()
            found.append((match.start(), Missing(ecosystem, name, line)))
            break
    return min(found, key=lambda item: item[0])[1] if found else None


def recipe(ecosystem: str, files: Iterable[str]) -> str:
    """The `[sandbox] setup` recipe (docs/setup.md) for the ecosystem, chosen by the tree's
    top-level files: `files` are the paths of the tree."""
    top = {path for path in files if "/" not in path}
    if ecosystem == "rust":
        return 'setup = ["cargo fetch"]  # recipe: cargo (build and test with --offline)'
    if ecosystem == "node":
        return 'setup = ["npm ci"]  # recipe: npm (with image = "retcon-sandbox/node")'
    if "requirements.txt" in top and not top & {"pyproject.toml", "setup.py", "setup.cfg"}:
        return 'setup = ["pip install -r requirements.txt"]  # recipe: pip'
    extra = "[test]" if "pyproject.toml" in top or "setup.cfg" in top else ""
    return (f'setup = ["pip install -e .{extra}"]  # recipes: setuptools-scm, pip, uv '
            "(name the extra that holds the test dependencies, if any)")


WHAT = {"python": "module", "rust": "crate", "node": "package"}
HOW = {"python": "a requirements file, or an extra such as `pip install -e .[test]`",
       "rust": "Cargo.toml's dependencies, fetched by `cargo fetch` into the image's CARGO_HOME",
       "node": "package.json and its lock file, installed by `npm ci`"}


def judge(failure: str | None, setup: tuple[str, ...], files: Iterable[str],
          which: str) -> ConfigError | str | None:
    """What the base commit's result means for the run: None when it passed; a configuration
    error when it failed for a missing dependency (a recipe when there is no setup; with one,
    that setup does not install it); else a warning's text (the run goes on)."""
    if failure is None:
        return None
    missing = find(failure)
    fail = "fails" if which == "build" else "fail"
    if missing is None:
        last = next((line for line in reversed(failure.strip().splitlines()) if line.strip()),
                    "")
        return (f"the base commit's {which} already {fail} ({last.strip()[:200]}): every "
                "commit must pass, so the first commit has to fix that too. If that is not "
                "the range's to fix, stop (Ctrl-C) and narrow --build/--test or give --skip")
    what = WHAT[missing.ecosystem]
    said = f"the base commit's {which} {fail}: the {what} {missing.name!r} is not installed " \
        f"in the sandbox\n    {missing.line[:300]}"
    if not setup:
        return ConfigError(
            f"{said}\nEvery commit fails the same way: the run stops before asking for a fix.",
            f"Install the project's dependencies with [sandbox] setup, e.g.\n    [sandbox]\n    "
            f"{recipe(missing.ecosystem, files)}\n(docs/setup.md: Recipes), "
            "then rerun: the first commit is verified again. If the failure is expected, rerun "
            "with --no-base-check.")
    return ConfigError(
        f"{said}\n[sandbox] setup ran ({'; '.join(setup)[:200]}) but does not install it: "
        "the run stops before asking for a fix.",
        f"Make [sandbox] setup install {missing.name!r} ({HOW[missing.ecosystem]}), e.g."
        "\n    [sandbox]\n    "
        f"{recipe(missing.ecosystem, files)}\nthen rerun: the first commit is verified again. "
        "If the failure is expected, rerun with --no-base-check.")
