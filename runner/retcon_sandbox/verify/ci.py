"""`verify` in the formats CI systems read: a JUnit XML report (`--junit FILE`), GitHub
Actions annotations (`--format github`) and a Markdown job summary (`--summary FILE`, appended,
as GitHub's `$GITHUB_STEP_SUMMARY` wants).

Everything in them that comes from the repository (subjects, output) is untrusted. In the XML it
goes through `text.sanitize` (no terminal control reaches a log viewer) and then loses what XML
1.0 cannot carry at all (lone surrogates, U+FFFE, U+FFFF), visibly escaped; ElementTree escapes
the markup. On GitHub, every line printed is read for `::command::` lines, so the whole run's
output is wrapped in `::stop-commands::` with a random token, and only our own annotations come
after it, with the workflow-command escaping of their data and properties. An annotation points
at a file and line only when the output names one that is a file of the commit's tree (relative
to the repository, or under the sandbox's /workspace), never anywhere else. In the Markdown,
every value from the repository is a code span or an escaped `<pre>` (see markup.py).
"""

from __future__ import annotations

import posixpath
import re
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TextIO

from retcon_sandbox.errors import RetconError
from retcon_sandbox.markup import html_text, md_code, md_pre
from retcon_sandbox.outfile import OutFile
from retcon_sandbox.text import sanitize, sanitize_name
from retcon_sandbox.verify.cache import Outcome
from retcon_sandbox.verify.table import Row, cells, summary, totals, verdicts

FORMATS = ("table", "github")
SUITE = "retcon-sandbox verify"
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


# --- JUnit XML -------------------------------------------------------------------------------


def xml_text(text: str) -> str:
    """Text that any XML 1.0 parser reads back as what a terminal would show."""
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", sanitize(text))


def _first_line(outcome: Outcome) -> str:
    lines = (outcome.failure or "").splitlines()
    return lines[0] if lines else "failed"


def _failed_stage(outcome: Outcome) -> str:
    failing = next((s for s in outcome.stages if not s.passed), None)
    return failing.which if failing else "verify"


def _case(row: Row) -> ET.Element:
    case = ET.Element("testcase", {
        "classname": xml_text(SUITE),
        "name": xml_text(f"#{row.number} {row.sha[:12]} {row.subject}"),
        "time": f"{row.outcome.seconds:.3f}" if row.outcome else "0"})
    outcome = row.outcome
    if outcome is None:
        ET.SubElement(case, "skipped", {"message": "not run"})
    elif not outcome.passed:
        failure = ET.SubElement(case, "failure", {"message": xml_text(_first_line(outcome)),
                                                  "type": _failed_stage(outcome)})
        failure.text = xml_text(outcome.tail)
    if outcome is not None and outcome.cached:
        ET.SubElement(case, "properties").append(
            ET.Element("property", {"name": "cached", "value": "true"}))
    return case


def junit(label: str, rows: Sequence[Row], seconds: float) -> str:
    """One test suite for the range, one test case per commit (a failure carries the tail of
    the commit's output)."""
    failed = sum(1 for r in rows if r.outcome is not None and not r.outcome.passed)
    skipped = sum(1 for r in rows if r.outcome is None)
    counts = {"tests": str(len(rows)), "failures": str(failed), "errors": "0",
              "skipped": str(skipped), "time": f"{seconds:.3f}"}
    root = ET.Element("testsuites", {"name": SUITE, **counts})
    suite = ET.SubElement(root, "testsuite", {"name": xml_text(label), **counts})
    suite.extend(_case(row) for row in rows)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


# --- GitHub Actions workflow commands --------------------------------------------------------


def escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF encoded, so it stays one line."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value: also `:` and `,`, which end it."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


# Where failing output names a file and line: a Python traceback's `File "x.py", line 3`,
# cargo's `--> src/x.rs:3:5`, a node stack frame's `at f (x.js:3:5)` or `at x.js:3:5`, and the
# `path:line: ` (or `path:line:col: `) that starts a line of pytest, gcc, mypy, tsc and others.
LOCATIONS = (
    re.compile(r'File "(?P<path>[^"\n]+)", line (?P<line>\d+)'),
    re.compile(r"-->\s*(?P<path>[^\s:]+):(?P<line>\d+)(?::(?P<col>\d+))?"),
    re.compile(r"\bat (?:[^\n(]*\()?(?P<path>[^\s():]+):(?P<line>\d+):(?P<col>\d+)\)?"),
    re.compile(r"^(?P<path>\S+?):(?P<line>\d+):(?:(?P<col>\d+):)?(?=\s|$)", re.MULTILINE),
)
WORKSPACE = "/workspace/"  # where a sandbox holds the tree: absolute paths under it are its own


@dataclass(frozen=True)
class Location:
    path: str
    line: int
    col: int | None = None


def repository_path(named: str) -> str | None:
    """A path the output names, relative to the repository, or None when it is outside (an
    absolute path elsewhere, one that climbs out with `..`)."""
    if named.startswith(WORKSPACE):
        named = named[len(WORKSPACE):]
    if named.startswith("/"):
        return None
    normal = posixpath.normpath(named)
    if normal in (".", "..") or normal.startswith("../"):
        return None
    return normal


def locate(output: str, files: Container[str]) -> Location | None:
    """The first place, in the order the output names them, that is a file of the tree; only
    a path that prints as itself (nothing sanitising would change) is taken."""
    found = sorted((m.start(), m) for pattern in LOCATIONS for m in pattern.finditer(output))
    for _, match in found:
        path = repository_path(match["path"])
        line = int(match["line"])
        if path is None or path not in files or line < 1 or sanitize_name(path) != path:
            continue
        col = match.groupdict().get("col")
        return Location(path, line, int(col) if col else None)
    return None


def _where(location: Location | None) -> str:
    if location is None:
        return ""
    col = f",col={location.col}" if location.col else ""
    return f"file={escape_property(location.path)},line={location.line}{col},"


Files = Callable[[str], Container[str]]  # the paths of a tree's files


def github_annotations(rows: Sequence[Row], files: Files | None = None) -> list[str]:
    """One `::error` line per failing commit: the failure as its title, the tail as its text,
    and where the output names a file of the commit's tree and a line, that place."""
    lines = []
    for row in rows:
        outcome = row.outcome
        if outcome is None or outcome.passed:
            continue
        title = sanitize(f"#{row.number} {row.sha[:7]} {row.subject}: {_first_line(outcome)}"
                         + (" (cached)" if outcome.cached else ""))
        message = sanitize(outcome.tail.strip("\n") or _first_line(outcome))
        place = locate(outcome.failure or outcome.tail, files(row.tree)) if files else None
        lines.append(f"::error {_where(place)}title={escape_property(title)}::"
                     f"{escape_data(message)}")
    return lines


# --- Markdown, for a job summary ----------------------------------------------------------


def markdown_table(rows: Sequence[Row], planned: dict[str, bool]) -> list[str]:
    """The verify table in Markdown: one row per commit, its subject a code span."""
    lines = ["| # | commit | build | tests | time | cached | subject |",
             "|--:|---|---|---|--:|---|---|"]
    for row in rows:
        shown = replace(row, state="done") if row.outcome is not None else row
        build, tests, seconds, cached = cells(shown, planned, 0.0)
        lines.append(f"| {row.number} | `{row.sha[:7]}` | {build or '-'} | {tests or '-'} | "
                     f"{seconds} | {cached} | {md_code(row.subject, cell=True)} |")
    return lines


def markdown_failures(rows: Sequence[Row]) -> list[str]:
    """Each failing commit's first line, with the tail of its output folded under it."""
    lines: list[str] = []
    for row in rows:
        outcome = row.outcome
        if outcome is None or outcome.passed:
            continue
        lines += ["", f"<details><summary>#{row.number} {row.sha[:7]}: "
                  f"{html_text(_first_line(outcome), one_line=True)}"
                  + (" (cached)" if outcome.cached else "") + "</summary>", "",
                  md_pre(outcome.tail or _first_line(outcome)), "", "</details>"]
    return lines


def markdown_claims(rows: Sequence[Row]) -> list[str]:
    found = [(row, row.claim) for row in rows if row.claim is not None and row.outcome]
    if not found:
        return []
    lines = ["", "Claimed by others (notes your key does not authenticate):", ""]
    for row, claim in found:
        assert claim is not None and row.outcome is not None
        used = "trusted (--trust-notes), not run" if row.outcome.claimed else \
            f"not trusted, ran again: {'PASS' if row.outcome.passed else 'FAIL'}"
        lines.append(f"- #{row.number} `{row.sha[:7]}` claimed {verdicts(claim)}; {used}")
    return lines


def markdown_summary(label: str, rows: Sequence[Row], seconds: float, planned: dict[str, bool],
                     shard_line: str = "") -> str:
    """The run as a job summary: the outcome, the table, the failures and the claims."""
    t = totals(rows)
    mark = "✓" if t.ok else "✗"
    head = [f"## retcon-sandbox verify {md_code(label)}", "",
            f"**{mark} " + (f"{shard_line}; " if shard_line else "") + f"{summary(t, seconds)}**",
            ""]
    return "\n".join([*head, *markdown_table(rows, planned), *markdown_failures(rows),
                      *markdown_claims(rows)]) + "\n\n"


# --- the outputs of one run --------------------------------------------------------------------


@dataclass
class Outputs:
    """What a verify run writes besides its table: a JUnit file, GitHub annotations (printed
    after the guarded output, once workflow commands are read again), a Markdown summary."""

    junit: OutFile | None = None
    github: bool = False
    summary: OutFile | None = None
    pending: list[str] = field(default_factory=list)

    @contextmanager
    def guard(self, out: TextIO) -> Iterator[None]:
        """With --format github, nothing printed inside is read as a workflow command (test
        output may hold `::add-mask::` or `::error::` lines of its own)."""
        if not self.github:
            yield
            return
        token = secrets.token_hex(16)
        out.write(f"::stop-commands::{token}\n")
        out.flush()
        try:
            yield
        finally:
            out.write(f"::{token}::\n" + "".join(line + "\n" for line in self.pending))
            out.flush()

    def finish(self, label: str, rows: Sequence[Row], seconds: float,
               planned: dict[str, bool] | None = None, shard_line: str = "",
               files: Files | None = None) -> str | None:
        """Write the JUnit file and the summary; keep the annotations for the end of the guard
        (`files`: a tree's files, for the places they point at). Why a file could not be
        written (a full disk, a directory made read-only meanwhile), or None."""
        if self.github:
            self.pending = github_annotations(rows, files)
        problems = []
        if self.summary is not None:
            text = markdown_summary(label, rows, seconds,
                                    planned or {"build": True, "test": True}, shard_line)
            problem = self.summary.append(text)
            if problem:
                problems.append(f"the summary {problem}")
        if self.junit is not None:
            try:  # atomically: never half a report, never through a link
                self.junit.write(junit(label, rows, seconds).encode("utf-8"))
            except OSError as exc:
                problems.append(f"the JUnit report {self.junit.path} was not written: "
                                f"{exc.strerror or exc}")
            except RetconError as exc:  # it became a link (or a folder, ...) meanwhile
                problems.append(f"the JUnit report {self.junit.path} was not written: "
                                f"{exc.message}")
        return "; ".join(problems) or None
