"""tomlkit as the oracle of every spec edit: many generated specs, written as people write TOML
(comments everywhere, CRLF, a byte-order mark, inline tables, arrays of tables, dotted keys,
every string form and every shape of `history`), each given one append of every kind of history
entry. After each save, tomlkit (an independent parser) must read the text as the same document
as tomllib does, and that document must be the one before plus exactly the new entry."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.spec.file import SpecFile
from retcon_sandbox.spec.history import (
    CommitCreated,
    Complete,
    Entry,
    NothingToExtract,
    Resolved,
    Response,
    Started,
    Stuck,
    kind_of,
    value_of,
)

tomlkit = pytest.importorskip("tomlkit")  # a dev dependency: absent from the lowest-deps run

BOM = "\ufeff"
SPECS = 120
TRICKY = ["plain", 'a "quoted" word', "back\\slash", "two\nlines", "tab\there", "]", "[", "#",
          "}", "{ stuck = 'x' }", '"""', "'''", "ünïcødé ✓", "\x01 control", "history = [",
          "trailing space ", "", "a,b", "\r\n", "emoji 🙂"]


def basic(value: str) -> str:
    """A basic string, escaped differently from the splicer's own writer (\\u everywhere)."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in " .-_/:") else
                  f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}" for c in value)
    return f'"{out}"'


def any_string(rng: random.Random, value: str) -> str:
    """`value` (letters and spaces only) in one of TOML's four string forms."""
    return rng.choice([f'"{value}"', f"'{value}'", f'"""\n{value}"""', f"'''{value}'''",
                       basic(value)])


def gap(rng: random.Random) -> str:
    return rng.choice(["", "", "\n", "# a comment\n", "\n# [[commit]] in a comment\n",
                       "   \n", "#\thistory = [\n"])


def trail(rng: random.Random) -> str:
    return rng.choice(["", "", "  # a comment", " #]", "\t"])


def entry_text(rng: random.Random, entry: Entry) -> str:
    kind = kind_of(entry)
    if kind.bare:
        return rng.choice([f'"{kind.key}"', f"'{kind.key}'"])
    key = rng.choice([kind.key, f'"{kind.key}"', f"'{kind.key}'"])
    value = value_of(entry) or ""
    literal = "'" not in value and value.isprintable()
    return rng.choice([f"{{ {key} = {basic(value)} }}", f"{{{key}={basic(value)}}}",
                       f"{{ {key} = '{value}' }}" if literal else f"{{ {key} = {basic(value)} }}"])


def history_text(rng: random.Random, entries: list[Entry]) -> str | None:
    """`history = …` in one of the shapes people write, or None (no history key)."""
    items = [entry_text(rng, e) for e in entries]
    if not items:
        return rng.choice([None, "history = []", "history = [ ]", "history = [\n]",
                           "history = [\n  # nothing yet\n]", "history = [ # none\n]"])
    shape = rng.randrange(6)
    if shape == 0:
        return f"history = [{', '.join(items)}]"
    if shape == 1:
        return f"history = [ {', '.join(items)}, ]"
    if shape == 2:
        return "history = [\n" + "".join(f"    {i},{trail(rng)}\n" for i in items) + "]"
    if shape == 3:
        return "history = [\n" + ",\n".join(f"  {i}" for i in items) + f"{trail(rng)}\n]"
    if shape == 4:
        return "history = [\n    " + ",\n    ".join(items) + "]"
    return "history = [  # entries\n" + "".join(f"\t{i} ,\n" for i in items) + "\n# end\n]"


def prefix_history(rng: random.Random) -> list[Entry]:
    """A valid beginning of a history (the appends then follow it)."""
    return rng.choice([[], [Started()], [Started(), CommitCreated("a" * 40)],
                       [Started(), Stuck("why\nnot"), Resolved("fixed it")],
                       [Response("ahead of time")]])


def commit_text(rng: random.Random, n: int) -> str:
    keys = [f"message = {any_string(rng, f'feat: step {n}')}{trail(rng)}"]
    if rng.random() < 0.5:
        keys.append(f"hints = {any_string(rng, 'keep it small')}{trail(rng)}")
    if rng.random() < 0.5:
        keys.append(rng.choice(['paths = ["src/a.py", \'docs/**\']',
                                'paths = [\n  "src/a.py",  # the code\n  "tests/",\n]']))
    history = history_text(rng, prefix_history(rng))
    if history is not None:
        keys.insert(rng.randrange(len(keys) + 1), history + trail(rng))
    header = rng.choice(["[[commit]]", "[[ commit ]]", '[["commit"]]', "[[commit]]  # #"])
    return header + "\n" + "".join(gap(rng) + k + "\n" for k in keys)


def spec_text(rng: random.Random) -> str:
    parts = [gap(rng), 'source = "feature"\n', f"remote = {any_string(rng, 'main')}\n",
             "cleaned = 'feature-clean'  # written by the run\n"]
    sandbox = rng.randrange(4)  # none, dotted keys, an inline table, a [sandbox] table last
    if sandbox == 1:
        parts.append('sandbox.timeout = 300\nsandbox . "build" = "make"  # dotted keys\n')
    elif sandbox == 2:
        parts.append('sandbox = { test = "make test", pids = 64 }\n')
    for n in range(1, rng.randrange(1, 5) + 1):
        parts += [gap(rng), commit_text(rng, n)]
    if sandbox == 3:
        parts.append('\n[sandbox]\nbuild = "make"  # the build\n"test" = \'make test\'\n')
    text = "".join(parts)
    if rng.random() < 0.3:
        text = text.replace("\n", "\r\n")
    return (BOM if rng.random() < 0.3 else "") + text


def parsed(text: str) -> dict[str, Any]:
    """The document as tomllib reads it, and as tomlkit does: they must agree."""
    body = text.removeprefix(BOM)
    ours = tomllib.loads(body)
    oracle = tomlkit.parse(body).unwrap()
    assert oracle == ours
    return ours


APPENDS: list[Entry] = [Started(), CommitCreated("b" * 40), Stuck("cannot\tsee \"why\""),
                        Resolved("see ]] and # and \\"), Response("next time: {x}"),
                        NothingToExtract("all in #1\r\nreally"), Complete()]


@pytest.mark.parametrize("seed", range(SPECS))
def test_every_append_reads_the_same_to_tomlkit(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    text = spec_text(rng)
    path = tmp_path / "spec.toml"
    path.write_bytes(text.encode())
    before = parsed(text)
    specfile = SpecFile(path)
    number = rng.randrange(len(specfile.load().commits))
    commit = specfile.load().commits[number]
    extra = [*APPENDS, Stuck(rng.choice(TRICKY)), Resolved(rng.choice(TRICKY))]
    for entry in extra:
        _, commit = specfile.append(commit, entry)
        after = parsed(path.read_bytes().decode())
        table = before["commit"][number]
        expected = {**table, "history": [*table.get("history", []), as_toml(entry)]}
        assert after == {**before, "commit": [*before["commit"][:number], expected,
                                              *before["commit"][number + 1:]]}
        before = after
    written = path.read_bytes().decode()
    assert written.startswith(BOM) == text.startswith(BOM)
    newlines = written.count("\n")
    assert written.count("\r\n") == (newlines if "\r\n" in text else 0)


def as_toml(entry: Entry) -> str | dict[str, str]:
    kind = kind_of(entry)
    return kind.key if kind.bare else {kind.key: value_of(entry) or ""}


def test_the_oracle_sees_a_wrong_splice() -> None:
    """The comparison can fail: a splice that changes another table is caught."""
    text = '[[commit]]\nmessage = "a"\nhistory = ["started"]\n'
    before = parsed(text)
    wrong = parsed(text.replace('"a"', '"b"').replace('["started"]', '["started", "complete"]'))
    assert wrong != {**before, "commit": [{**before["commit"][0],
                                           "history": ["started", "complete"]}]}
