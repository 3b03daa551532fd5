"""The pure parts of `verify`: what a target names, and how rows read."""

from __future__ import annotations

import unicodedata

import pytest

from retcon_sandbox.errors import UsageError
from retcon_sandbox.verify.cache import Outcome, Stage
from retcon_sandbox.verify.table import (
    RangeTarget,
    Row,
    SpecTarget,
    cells,
    failures,
    parse_target,
    render_row,
    summary,
    totals,
)

BOTH = {"build": True, "test": True}


@pytest.mark.parametrize(("target", "spec", "is_file", "expected"), [
    ("spec.toml", None, True, SpecTarget("spec.toml")),
    (None, "spec.toml", False, SpecTarget("spec.toml")),
    ("spec.toml", "spec.toml", True, SpecTarget("spec.toml")),
    ("main..feature", None, False, RangeTarget("main", "feature", "main..feature")),
    ("main..feature", "spec.toml", False, RangeTarget("main", "feature", "main..feature")),
    ("main..", None, False, RangeTarget("main", "HEAD", "main..")),
    ("..feature", None, False, RangeTarget("HEAD", "feature", "..feature")),
    ("abc123", None, False, RangeTarget(None, "abc123", "abc123")),
])
def test_targets(target: str | None, spec: str | None, is_file: bool,
                 expected: SpecTarget | RangeTarget) -> None:
    assert parse_target(target, spec, is_file) == expected


@pytest.mark.parametrize(("target", "spec", "is_file", "message"), [
    (None, None, False, "needs a spec or a revision range"),
    ("a.toml", "b.toml", True, "two specs given"),
    ("main...feature", None, False, "symmetric ranges"),
    (" ", None, False, "empty revision range"),
])
def test_targets_refused(target: str | None, spec: str | None, is_file: bool,
                         message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_target(target, spec, is_file)


def stage(which: str, verdict: str = "PASS", seconds: float = 1.0) -> Stage:
    return Stage(which, "cmd", verdict, verdict == "PASS", "timed out" in verdict, seconds)


def outcome(*stages: Stage, cached: bool = False, tail: str = "") -> Outcome:
    failed = next((s for s in stages if not s.passed), None)
    failure = None if failed is None else f"{failed.which.title()} {failed.verdict} in 1.0s"
    return Outcome(stages, failure, tail, 600, cached)


@pytest.mark.parametrize(("row", "planned", "expected"), [
    (Row(1, "a" * 40, "t", "s"), BOTH, ("", "", "", "")),
    (Row(1, "a" * 40, "t", "s", "running", started=10.0), BOTH, ("…", "…", "5s", "")),
    (Row(1, "a" * 40, "t", "s", "done", outcome=outcome(stage("build"), stage("test"))), BOTH,
     ("PASS", "PASS", "2.0s", "")),
    (Row(1, "a" * 40, "t", "s", "done",
         outcome=outcome(stage("build", "FAIL (exit 1)", 0.3))), BOTH,
     ("FAIL", "-", "0.3s", "")),
    (Row(1, "a" * 40, "t", "s", "done",
         outcome=outcome(stage("build"), stage("test", "FAIL (timed out after 60s)", 60),
                         cached=True)), BOTH,
     ("PASS", "TIMEOUT", "61.0s", "yes")),
    (Row(1, "a" * 40, "t", "s", "done", outcome=outcome(stage("test"))),
     {"build": False, "test": True}, ("none", "PASS", "1.0s", "")),
])
def test_cells(row: Row, planned: dict[str, bool], expected: tuple[str, ...]) -> None:
    assert cells(row, planned, now=15.0) == expected


def test_untrusted_subjects_and_output_are_sanitised() -> None:
    evil = "fix\x1b]52;c;cHduZWQ=\x07 \u202eexe.txt"
    row = Row(2, "b" * 40, "t", evil, "done",
              outcome=outcome(stage("build", "FAIL (exit 1)"), tail="\x1b[2Jboom\r"))
    line = render_row(row, BOTH, 0.0, 200, 1)
    text = "\n".join(failures([row]))
    for shown in (line, text):
        assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown
    assert "fix\\e]52;c;cHduZWQ=\\x07 \\u202eexe.txt" in line
    assert "\\e[2Jboom\\r" in text and "#2 bbbbbbb" in text


def test_rows_fit_the_width() -> None:
    row = Row(1, "c" * 40, "t", "x" * 300)
    assert len(render_row(row, BOTH, 0.0, 60, 1)) == 60


def columns(text: str) -> int:
    """Terminal columns, counted independently of the code under test."""
    return sum(0 if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


WIDE = ("修复登录页面的问题" * 20, "ｆｕｌｌｗｉｄｔｈ" * 20, "🎉🚀✅" * 40,
        "e\u0301" * 200, "a\u0308\u0323" * 200, "x修e\u0301🎉" * 60, "🇫🇷🇩🇪" * 40,
        "\t修" * 100)


@pytest.mark.parametrize("subject", WIDE)
@pytest.mark.parametrize("width", [1, 2, 37, 60, 61, 80])
def test_rows_fit_the_display_width(subject: str, width: int) -> None:
    """Wide characters take two columns, combining marks none: a row is cut by columns, never
    past the terminal's width and never between a character and its marks."""
    line = render_row(Row(1, "c" * 40, "t", subject), BOTH, 0.0, width, 1)
    assert columns(line) <= width and line.endswith("…")
    assert columns(line) >= width - 2  # filled, less at most one wide character
    body = line[:-1]
    full = render_row(Row(1, "c" * 40, "t", subject), BOTH, 0.0, 10_000, 1)
    assert full.startswith(body)
    assert not unicodedata.combining(full[len(body)])  # the cut falls before a new character
    pairs = sum(1 for c in body if "\U0001f1e6" <= c <= "\U0001f1ff")
    assert pairs % 2 == 0  # a flag is never halved


def test_a_row_that_fits_is_left_whole() -> None:
    subject = "修复" * 5
    line = render_row(Row(1, "c" * 40, "t", subject), BOTH, 0.0, 200, 1)
    assert line.endswith(subject) and columns(line) < 200


def test_totals_and_summary() -> None:
    rows = [Row(1, "a" * 40, "t1", "s", "done", outcome=outcome(stage("build"), cached=True)),
            Row(2, "b" * 40, "t2", "s", "done",
                outcome=outcome(stage("build", "FAIL (exit 2)"))),
            Row(3, "c" * 40, "t3", "s")]
    t = totals(rows)
    assert (t.commits, t.passed, t.failed, t.cached, t.ok) == (3, 1, 1, 1, False)
    assert summary(t, 2.25) == "3 commits: 1 passed, 1 failed (1 cached), in 2.2 s"
    assert totals(rows[:1]).ok
    assert not totals(rows[2:]).ok  # a commit without a result is not a pass
