"""The draft as a spec file, in the style of a hand-written one (see the demo's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def guess_commands(files: frozenset[str]) -> GuessedCommands:
    """Commands for the usual layouts (a Cargo, npm or Python project at the root)."""
    if "Cargo.toml" in files:
        return GuessedCommands("cargo build --offline", "cargo test --offline",
                               "retcon-sandbox/rust", "Cargo.toml")
    if "package.json" in files:
        return GuessedCommands(None, "npm test", "retcon-sandbox/node", "package.json")
    python = sorted({p.split("/")[0] for p in files if p.endswith(".py")})
    if python:
        has_tests = any(p.rsplit("/", 1)[-1].startswith("test_") or p.startswith("tests/")
                        for p in files if p.endswith(".py"))
        return GuessedCommands("python3 -m compileall -q .",
                               "python3 -m pytest -q -p no:cacheprovider" if has_tests else None,
                               None, "the Python files")
    return GuessedCommands()


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
