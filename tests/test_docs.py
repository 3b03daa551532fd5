"""The documentation against itself and the code: every internal link resolves, the README stays
a front door, and docs/commands.md states the defaults the parser and its --help have."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from retcon_sandbox.cli import parser
from retcon_sandbox.commands.options import default_pipeline
from retcon_sandbox.spec.settings import BY_KEY, LOWER_ONLY, shown
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
         *sorted((ROOT / "docs").rglob("*.md"))]
COMMANDS = ROOT / "docs" / "commands.md"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


# --- links ------------------------------------------------------------------------------------


def prose(text: str) -> str:
    """The text outside fenced code blocks, with code spans blanked (they hold no links)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "`code`", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", path.read_text(encoding="utf-8"),
                  flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link or #anchor of `page` that does not resolve, as `page: target`."""
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{page.name}: {target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_internal_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## The `--json` events\n\n## Setup\n## Setup\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#the---json-events) [ok](other.md#setup-1) "
                    "[ok](#page) [web](https://example.com/x.md#nowhere)\n"
                    "`[code](nowhere.md)`\n```\n[block](nowhere.md)\n```\n"
                    "[gone](missing.md) [bad](other.md#setup-2) [bad](#nowhere)\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#setup-2 (no such heading)",
                                  "page.md: #nowhere (no such heading)"]


# --- the README is a front door -----------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    top = parser()
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_the_readme_is_a_front_door() -> None:
    """At most 200 lines, with plan → execute → verify, the path a newcomer takes, in the
    first 100, and one line for each command."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    first = "\n".join(lines[:100])
    steps = [first.find(f"retcon-sandbox {name} ") for name in ("plan", "execute", "verify")]
    assert -1 not in steps and steps == sorted(steps), steps
    listed = {m.group(1) for line in lines if (m := re.match(r"\| `(\w+)", line))}
    assert listed == set(subcommands()) - {"reconstruct"}  # the alias is named on execute's line


# --- defaults: docs/commands.md, the parser and its --help agree ------------------------------


def defaults_table() -> list[tuple[list[str], list[str], str]]:
    """(options, commands, default) of each row of docs/commands.md's Defaults table."""
    text = COMMANDS.read_text(encoding="utf-8")
    section = text.split("\n## Defaults\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            options = re.findall(r"`(-[^`]+)`", cells[0])
            rows.append((options, [c.strip() for c in cells[1].split(",")], plain(cells[2])))
    return rows


def plain(text: str) -> str:
    return " ".join(text.replace("`", "").split()).lower()


def action(command: str, option: str) -> argparse.Action:
    found = [a for a in subcommands()[command]._actions if option in a.option_strings]
    assert found, f"{command} has no {option}"
    return found[0]


ROWS = defaults_table()


def test_the_defaults_table_covers_what_users_asked_about() -> None:
    options = {option for row in ROWS for option in row[0]}
    assert {"--remote", "--pipeline", "--no-pipeline", "-j", "--timeout", "--setup-disk",
            "--keep-environments", "--format"} <= options


@pytest.mark.parametrize(("options", "commands", "default"), ROWS, ids=[r[0][0] for r in ROWS])
def test_a_stated_default_is_the_parsers_and_its_helps(options: list[str], commands: list[str],
                                                       default: str) -> None:
    for command in commands:
        actions = [action(command, option) for option in options]
        first = actions[0]
        held = first.default
        if held not in (None, False, [], (), argparse.SUPPRESS):  # argparse holds it
            assert plain(str(held)) == default, (command, options)
        else:  # the code decides later: its --help must say the same
            assert re.search(rf"(?<![\w.]){re.escape(default)}(?![\w])",
                             plain(first.help or "")), (command, options, first.help)


def test_code_held_defaults_match_the_table() -> None:
    """The defaults the parser leaves to the code: the limits, the jobs and the pipeline."""
    stated = {option: default for options, _, default in ROWS for option in options}
    for key, option in LOWER_ONLY.items():
        assert stated[option] == shown(key, BY_KEY[key].default), option
    assert stated["-j"] == "the number of cores"
    assert default_pipeline("docker", ["unix:///var/run/docker.sock"]) == "warm"
    assert default_pipeline("docker", ["ssh://user@host"]) == "off"
    assert stated["--pipeline"].startswith("the pre-warm: only the next sandbox")
    assert "nothing over ssh://" in stated["--pipeline"]


def test_quiet_and_verbose_are_described_as_their_help_says() -> None:
    text = " ".join(COMMANDS.read_text(encoding="utf-8").split())
    for option in ("-q/--quiet", "-v/--verbose"):
        help_text = action("execute", option.split("/")[0]).help
        assert f"`{option}`: {help_text};" in text or f"`{option}`: {help_text}." in text


def test_every_option_of_every_command_is_in_the_commands_page() -> None:
    text = COMMANDS.read_text(encoding="utf-8")
    missing = sorted({f"{name} {option}" for name, command in subcommands().items()
                      for a in command._actions for option in a.option_strings
                      if option.startswith("--") and option not in ("--help", "--version")
                      and not re.search(rf"{re.escape(option)}(?![\w-])", text)})
    assert missing == []
