"""The pure parts of `retcon-sandbox verify`: what the target names, and the table of results.

No I/O here: the command (commands/verify.py) resolves revisions, runs the sandboxes and writes
what these functions render. Everything interpolated from the repository (subjects, output) goes
through `text.sanitize`; the only control sequences written are the display's own.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from retcon_sandbox.errors import UsageError
from retcon_sandbox.text import sanitize, sanitize_name
from retcon_sandbox.verify.cache import Outcome, Stage

# --- the target --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecTarget:
    """The spec's cleaned branch, from the merge-base of its source and remote."""

    path: str


@dataclass(frozen=True)
class RangeTarget:
    """`BASE..TIP` (an empty side is HEAD), or one commit (`base` None)."""

    base: str | None
    tip: str
    text: str


def parse_target(target: str | None, spec: str | None, is_file: bool) -> SpecTarget | RangeTarget:
    """What `verify [TARGET] [--spec FILE]` verifies. A TARGET that is an existing file is a
    spec; anything else is a revision range."""
    if target is None:
        if spec is None:
            raise UsageError("verify needs a spec or a revision range",
                             "For example: retcon-sandbox verify history-spec.toml, or "
                             "retcon-sandbox verify main..feature --test 'pytest -q'.")
        return SpecTarget(spec)
    if is_file:
        if spec is not None and spec != target:
            raise UsageError(f"two specs given: {target} and --spec {spec}")
        return SpecTarget(target)
    if "..." in target:
        raise UsageError(f"{target!r}: symmetric ranges (A...B) are not supported",
                         "Give BASE..TIP: the commits reachable from TIP and not from BASE.")
    if ".." in target:
        base, _, tip = target.partition("..")
        return RangeTarget(base or "HEAD", tip or "HEAD", target)
    if not target.strip():
        raise UsageError("an empty revision range")
    return RangeTarget(None, target, target)


# --- the rows ------------------------------------------------------------------------------


@dataclass
class Row:
    """One commit of the range, as the table shows it. `state`: queued, running or done."""

    number: int
    sha: str
    tree: str
    subject: str
    state: str = "queued"
    started: float = 0.0
    outcome: Outcome | None = None
    claim: Outcome | None = None  # what a note others wrote claims for this tree
    phase: str = ""  # while running: the step under way (build, tests), when known


PLANNED = ("build", "test")


def short(stage: Stage | None, planned: bool, reached: bool) -> str:
    """A stage in a word: PASS, FAIL, TIMEOUT; `none` without a command; `-` not reached."""
    if not planned:
        return "none"
    if stage is None:
        return "" if reached else "-"
    if stage.passed:
        return "PASS"
    return "TIMEOUT" if stage.timed_out else "FAIL"


def cells(row: Row, planned: dict[str, bool], now: float) -> tuple[str, str, str, str]:
    """build, tests, seconds, cached."""
    if row.state == "queued":
        return ("", "", "", "")
    if row.state == "running" or row.outcome is None:
        elapsed = f"{max(0.0, now - row.started):.0f}s"
        if row.phase == "build":
            return ("build…", "", elapsed, "")
        if row.phase == "tests":
            return ("PASS" if planned["build"] else "none", "tests…", elapsed, "")
        return ("…", "…", elapsed, "")
    outcome = row.outcome
    build = outcome.stage("build")
    test = outcome.stage("test")
    return (short(build, planned["build"], True),
            short(test, planned["test"], build is None or build.passed),
            f"{outcome.seconds:.1f}s",
            "claim" if outcome.claimed else "yes" if outcome.cached else "")


def header(width: int, digits: int) -> str:
    return _fit(f"  {'#':>{digits}}  {'commit':<8} {'build':<7} {'tests':<7} {'time':>7}  "
                f"{'cached':<6}  subject", width)


def render_row(row: Row, planned: dict[str, bool], now: float, width: int, digits: int) -> str:
    build, tests, seconds, cached = cells(row, planned, now)
    return _fit(f"  {row.number:>{digits}}  {row.sha[:7]:<8} {build:<7} {tests:<7} {seconds:>7}  "
                f"{cached:<6}  " + sanitize_name(row.subject), width)


def _fit(line: str, width: int) -> str:
    """The line, cut to at most `width` terminal columns with an ellipsis; a character is never
    split from the marks that combine with it."""
    clusters = _clusters(line)
    if sum(w for _, w in clusters) <= width:
        return line
    kept, used = [], 0
    for text, w in clusters:
        if used + w > width - 1:
            break
        kept.append(text)
        used += w
    return "".join(kept) + "…" if width >= 1 else ""


def _clusters(line: str) -> list[tuple[str, int]]:
    """The line as user-perceived characters (a base and the zero-width marks after it; a pair
    of regional indicators), each with the columns it takes (wide and full-width: 2)."""
    clusters: list[tuple[str, int]] = []
    for char in line:
        w = _columns(char)
        pair = _regional(char) and clusters and len(clusters[-1][0]) == 1 \
            and _regional(clusters[-1][0])
        if clusters and (w == 0 or pair):
            text, before = clusters[-1]
            clusters[-1] = (text + char, before + w)
        else:
            clusters.append((char, w))
    return clusters


def _columns(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf") \
            or "\u1160" <= char <= "\u11ff":  # Hangul medial vowels and final consonants
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _regional(char: str) -> bool:
    return "\U0001f1e6" <= char <= "\U0001f1ff"


def failures(rows: Sequence[Row]) -> list[str]:
    """For each failing commit: what failed, and the tail of its output."""
    lines: list[str] = []
    for row in rows:
        outcome = row.outcome
        if outcome is None or outcome.passed:
            continue
        first = (outcome.failure or "").splitlines()[0] if outcome.failure else "failed"
        lines += ["", sanitize(f"  #{row.number} {row.sha[:7]} {row.subject}: {first}"
                               + (" (cached)" if outcome.cached else ""))]
        if outcome.tail:
            lines += [sanitize("      " + line) for line in outcome.tail.split("\n")]
    return lines


def verdicts(outcome: Outcome) -> str:
    return ", ".join(f"{'build' if s.which == 'build' else 'tests'} {s.verdict}"
                     for s in outcome.stages)


def claims(rows: Sequence[Row]) -> list[str]:
    """For each commit that a note others wrote claims a result for: the claim, and whether it
    was used (--trust-notes) or the commit ran again (and what it gave)."""
    lines: list[str] = []
    for row in rows:
        claim, outcome = row.claim, row.outcome
        if claim is None or outcome is None:
            continue
        if outcome.claimed:
            what = "trusted (--trust-notes), not run"
        else:
            what = f"not trusted, ran again: {'PASS' if outcome.passed else 'FAIL'}"
        lines.append(sanitize(f"  #{row.number} {row.sha[:7]} {row.subject}: claimed "
                              f"{verdicts(claim)}; {what}"))
    return lines


def claimed(row: Row) -> dict[str, object] | None:
    """A row's claim by others, for --json."""
    claim = row.claim
    if claim is None:
        return None
    stages = {s.which: s.verdict for s in claim.stages}
    return {"passed": claim.passed, "build": stages.get("build"), "tests": stages.get("test"),
            "trusted": bool(row.outcome is not None and row.outcome.claimed)}


@dataclass(frozen=True)
class Totals:
    commits: int
    passed: int
    failed: int
    cached: int

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed == self.commits


def totals(rows: Sequence[Row]) -> Totals:
    done = [r.outcome for r in rows if r.outcome is not None]
    return Totals(len(rows), sum(o.passed for o in done), sum(not o.passed for o in done),
                  sum(o.cached for o in done))


def summary(t: Totals, seconds: float) -> str:
    text = f"{t.commits} commit{'s' if t.commits != 1 else ''}: {t.passed} passed"
    if t.failed:
        text += f", {t.failed} failed"
    if t.cached:
        text += f" ({t.cached} cached)"
    return text + f", in {seconds:.1f} s"
