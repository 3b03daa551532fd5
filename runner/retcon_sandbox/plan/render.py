"""The draft as a spec file, in the style of a hand-written one (see the demo's)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retcon_sandbox.backends import manifests
from retcon_sandbox.backends.setupreads import local_archive
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
SETUP_TEXTS = ("pyproject.toml", "tox.ini")  # root files that say what the tests install
REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?"
                         r"((==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!-]+)?"
                         r"(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!-]+)*")
EXTRA = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MOST_DEPS = 20
LONGEST = 1000  # characters of a tox.ini line read


def test_extra(pyproject: str | None) -> str | None:
    """The extra of `[project.optional-dependencies]` that holds the test dependencies, by its
    usual names (the file is untrusted: parsed in memory, bounded, never an exception)."""
    document = manifests.parse(pyproject.encode("utf-8")) if pyproject else None
    project = document.get("project") if document else None
    extras = project.get("optional-dependencies") if isinstance(project, dict) else None
    if not isinstance(extras, dict):
        return None
    return next((name for name in TEST_EXTRAS if name in extras), None)


def tox_testenv(tox: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What tox.ini's `[testenv]` installs for the tests: its `deps` that are plain
    requirements (`name`, `name[extra]>=1.0`) and its `extras`. Anything else (`-r file`, a
    URL, a path, `{[x]deps}`, a factor's `py38: name`) is left out. Read line by line, in
    linear time (configparser's option pattern is quadratic in a line's spaces: the file is
    untrusted)."""
    values = _testenv_values(tox or "", ("deps", "extras"))
    deps = [line.replace(" ", "") for line in values["deps"]]
    extras = [e.strip() for line in values["extras"] for e in line.split(",")]
    plain = [d for d in deps if REQUIREMENT.fullmatch(d) and not local_archive(d)]
    return (tuple(dict.fromkeys(plain))[:MOST_DEPS],
            tuple(dict.fromkeys(e for e in extras if EXTRA.fullmatch(e)))[:MOST_DEPS])


def _testenv_values(ini: str, keys: tuple[str, ...]) -> dict[str, list[str]]:
    """The lines of `keys` in the `[testenv]` section of an INI file: the value after `=` and
    its indented continuation lines. Lines longer than LONGEST are skipped."""
    out: dict[str, list[str]] = {k: [] for k in keys}
    section, key = "", None
    for line in ini.splitlines():
        if len(line) > LONGEST or not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        if line[0] in " \t":  # a continuation of the key above
            if key is not None:
                out[key].append(line.strip())
            continue
        if line.startswith("["):  # a section; a malformed header opens none we read
            header = line.strip()
            section, key = header[1:-1].strip() if header.endswith("]") else "", None
            continue
        name, equals, value = line.partition("=")
        key = name.strip() if equals and section == "testenv" and name.strip() in keys else None
        if key is not None and value.strip():
            out[key].append(value.strip())
    return out


def guess_commands(files: frozenset[str], texts: Mapping[str, str] | None = None
                   ) -> GuessedCommands:
    """Commands for the usual layouts (a Cargo, npm or Python project at the root), and the
    setup that installs what a project of that layout declares: for Python, with the root
    pyproject.toml's test extra and tox.ini's test requirements (`texts`: SETUP_TEXTS)."""
    texts = texts or {}
    if "Cargo.toml" in files:
        return GuessedCommands("cargo build --offline", "cargo test --offline",
                               "retcon-sandbox/rust", "Cargo.toml",
                               "cargo fetch" if "Cargo.lock" in files else None)
    if "package.json" in files:
        locked = bool(files & {"package-lock.json", "npm-shrinkwrap.json"})
        return GuessedCommands(None, "npm test", "retcon-sandbox/node", "package.json",
                               "npm ci" if locked else None)
    if any(p.endswith(".py") for p in files):
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
                               _pip_setup(packaged, texts))
    return GuessedCommands()


def _pip_setup(packaged: bool, texts: Mapping[str, str]) -> str | None:
    """`pip install -e .` for a package, with the extras that hold its test dependencies (the
    pyproject.toml's test extra, else those tox installs), and the requirements tox installs
    for the tests, each quoted for the shell (`>` is a redirection)."""
    deps, tox_extras = tox_testenv(texts.get("tox.ini"))
    named = test_extra(texts.get("pyproject.toml"))
    extras = (named,) if named else tox_extras
    project = [f"-e '.[{','.join(extras)}]'" if extras else "-e ."] if packaged else []
    words = [*project, *(shlex.quote(d) for d in deps)]
    return " ".join(["pip install", *words]) if words else None


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
