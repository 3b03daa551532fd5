"""The draft as a spec file, in the style of a hand-written one (see the demo's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from retcon_sandbox.backends import manifests
from retcon_sandbox.paths import control_character
from retcon_sandbox.plan.draft import Group
from retcon_sandbox.spec.tomltext import basic_string
from retcon_sandbox.text import sanitize


@dataclass(frozen=True)
class Branches:
    source: str
    remote: str
    cleaned: str


@dataclass(frozen=True)
class GuessedCommands:
    """Build and test commands guessed from the tree, and what they were guessed from."""

    build: str | None = None
    test: str | None = None
    image: str | None = None
    reason: str = ""
    setup: str | None = None  # suggested, commented out: the user opts in to its network


TEST_EXTRAS = ("tests", "test", "testing")  # the names projects give their test extra


def test_extra(pyproject: str | None) -> str | None:
    """The extra of `[project.optional-dependencies]` that holds the test dependencies, by its
    usual names (the file is untrusted: parsed in memory, bounded, never an exception)."""
    document = manifests.parse(pyproject.encode("utf-8")) if pyproject else None
    project = document.get("project") if document else None
    extras = project.get("optional-dependencies") if isinstance(project, dict) else None
    if not isinstance(extras, dict):
        return None
    return next((name for name in TEST_EXTRAS if name in extras), None)


def guess_commands(files: frozenset[str], pyproject: str | None = None) -> GuessedCommands:
    """Commands for the usual layouts (a Cargo, npm or Python project at the root), and the
    setup that installs what a project of that layout declares (with the root
    pyproject.toml's test extra, when it has one)."""
    if "Cargo.toml" in files:
        return GuessedCommands("cargo build --offline", "cargo test --offline",
                               "retcon-sandbox/rust", "Cargo.toml",
                               "cargo fetch" if "Cargo.lock" in files else None)
    if "package.json" in files:
        locked = bool(files & {"package-lock.json", "npm-shrinkwrap.json"})
        return GuessedCommands(None, "npm test", "retcon-sandbox/node", "package.json",
                               "npm ci" if locked else None)
    python = sorted({p.split("/")[0] for p in files if p.endswith(".py")})
    if python:
        # what pytest collects by default (test_*.py, *_test.py), or anything in tests/
        has_tests = any(p.rsplit("/", 1)[-1].startswith("test_") or p.endswith("_test.py") or
                        p.startswith("tests/") for p in files if p.endswith(".py"))
        # `python3 -m pytest` puts the root on sys.path, not src/: a src layout's package
        # (src/NAME/__init__.py) imports only with it on PYTHONPATH
        src = any(p.startswith("src/") and p.count("/") == 2 and p.endswith("/__init__.py")
                  for p in files)
        test = "python3 -m pytest -q -p no:cacheprovider" if has_tests else None
        packaged = bool(files & {"pyproject.toml", "setup.py", "setup.cfg"})
        return GuessedCommands("python3 -m compileall -q .",
                               f"PYTHONPATH=src {test}" if test and src else test, None,
                               "the Python files (a src layout)" if src else "the Python files",
                               _pip_setup(test_extra(pyproject)) if packaged else None)
    return GuessedCommands()


def _pip_setup(extra: str | None) -> str:
    return f"pip install -e '.[{extra}]'" if extra else "pip install -e ."


def toml_string(value: str) -> str:
    """A TOML string: a multi-line literal where that reads best, else a basic string."""
    if "\n" in value and "'''" not in value and not any(
            (ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in value) \
            and not value.endswith("'") and "\r" not in value:
        return f"'''{value}'''"
    return basic_string(value)


def path_pattern(path: str) -> str:
    """A `paths` entry that matches `path` itself: glob characters are bracketed (`[*]`), and a
    character a `paths` entry cannot hold as such (`[`, a control character, a byte that is not
    UTF-8, held as a lone surrogate, a space at either end) is `?`, which matches any one
    character. So it may match another name too: the command checks the written spec's coverage
    of the changed files before it writes it."""
    out = []
    for char in path:
        if char in "*?":
            out.append(f"[{char}]")
        elif char == "[" or control_character(char) or 0xD800 <= ord(char) <= 0xDFFF:
            out.append("?")
        else:
            out.append(char)
    text = "".join(out)
    lead, trail = len(text) - len(text.lstrip()), len(text) - len(text.rstrip())
    return "?" * lead + text.strip() + "?" * trail if lead or trail else text


def spec_safe(text: str, subject: bool) -> str:
    """A message or hints a spec accepts (messy commit messages are untrusted text): control
    characters escaped visibly; a body keeps its newlines and tabs, a subject no tab."""
    first, *rest = sanitize(text).split("\n")
    return "\n".join([first.replace("\t", "\\t") if subject else first, *rest])


def spec_text(branches: Branches, groups: Sequence[Group], commands: GuessedCommands,
              header: str) -> str:
    lines = [f"# {line}" if line else "#" for line in sanitize(header).split("\n")]
    lines += [
        "# retcon-sandbox appends each commit's `history` as it works.",
        f"source = {basic_string(branches.source)}   # the messy branch (never modified)",
        f"remote = {basic_string(branches.remote)}   # what it will merge into",
        f"cleaned = {basic_string(branches.cleaned)}   # created at merge-base(source, remote)",
        "",
        "[sandbox]",
    ]
    if commands.reason:
        lines.append(f"# guessed from {commands.reason}: check them before you run")
    if commands.image:
        lines.append(f"image = {basic_string(commands.image)}")
    for key, value in (("build", commands.build), ("test", commands.test)):
        lines.append(f"{key} = {basic_string(value)}" if value else f'# {key} = "..."')
    if commands.setup:
        lines += ["# if the tests need the project's dependencies: setup runs first, with a",
                  "# registry's network (docs/setup.md)",
                  f"# setup = {basic_string(commands.setup)}"]
    for group in groups:
        lines += ["", "[[commit]]", f"message = {toml_string(spec_safe(group.message, True))}",
                  f"hints = {toml_string(spec_safe(group.hints, False))}"]
        if not group.model:  # a model extracts a hints commit: no `paths`
            lines.append("paths = [" + ", ".join(basic_string(path_pattern(p))
                                                 for p in group.paths) + "]")
        if group.versions:  # its part of files a later commit takes whole
            lines.append("versions = { " + ", ".join(f"{basic_string(p)} = {basic_string(c)}"
                                                     for p, c in group.versions) + " }")
        lines.append("history = []")
    return "\n".join(lines) + "\n"
