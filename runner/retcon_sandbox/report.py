"""Progress output: readable lines for a person, or one JSON event per line for CI.

Every JSON event carries the version of the event format (`schema`: a field is only added within
a version; renaming, removing or changing the meaning of one bumps it), its time, the run's id
and, where it applies, the commit's number. Human output goes through `text.sanitize` as a
whole: our own format strings are plain text, and everything interpolated into them (test
output, file names, subjects, summaries) may not be.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TextIO

from retcon_sandbox import progress
from retcon_sandbox.text import encodable, escape_undecodable, sanitize, sanitize_name


class Reporter(Protocol):
    run_id: str

    def emit(self, event: str, **data: Any) -> None: ...


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


RUN_ID = new_run_id()  # one per process: the run's events and its final `error` share it
SCHEMA = 1  # the version of the --json event format, in every event


class JsonReporter:
    def __init__(self, out: TextIO | None = None, run_id: str | None = None) -> None:
        self.out = out or sys.stdout
        self.run_id = run_id or RUN_ID
        self._lock = threading.Lock()

    def emit(self, event: str, **data: Any) -> None:
        record = {"event": event, "schema": SCHEMA, "time": round(time.time(), 3),
                  "run": self.run_id, **data}
        with self._lock:  # the heartbeat's thread emits too
            self.out.write(json_text(record) + "\n")
            self.out.flush()


def json_text(value: Any) -> str:
    """`value` as one line of JSON for --json: UTF-8, and no lone surrogate (strict parsers
    refuse `\\udce9`): each byte of a name that is not UTF-8 is written `\\xNN` in the string,
    as the terminal shows it (`text.encodable`); anything else JSON cannot hold, as its text."""
    return json.dumps(encodable(value), ensure_ascii=False,
                      default=lambda other: escape_undecodable(str(other)))


def _short(sha: str | None) -> str:
    return (sha or "")[:7]


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _verdict(d: dict[str, Any]) -> str:
    """PASS (2.9 s), FAIL (exit 1, 0.4 s), FAIL (timed out after 600s), PASS (cached)."""
    verdict, seconds = str(d["verdict"]), d.get("seconds")
    if d.get("cached"):
        return f"{verdict} (cached)"
    if seconds is None or "timed out" in verdict:
        return verdict
    if verdict.endswith(")"):
        return f"{verdict[:-1]}, {seconds:.1f} s)"
    return f"{verdict} ({seconds:.1f} s)"


def _names(paths: list[str], sep: str = ", ") -> str:
    """File names, one escaped line each: a newline in a name cannot fake another line."""
    return sep.join(sanitize_name(p) for p in paths)


def _fixes(n: int) -> str:
    return f" ({n} fix)" if n == 1 else f" ({n} fixes)" if n else ""


# One formatter per event; the JSON reporter sends the same events with their raw fields.
FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {
    "spec": lambda d: (f"Loading spec: {d['path']}\n  Source: {d['source']}\n"
                       f"  Remote: {d['remote']}\n  Cleaned: {d['cleaned']}\n"
                       f"  Sandbox: {d['sandbox']}"
                       + (f"\n  Engine: {d['engine']}" if d.get("engine") else "")
                       + (f"\n  Transcript: {d['transcript']}" if d.get("transcript") else "")),
    "override": lambda d: (f"  Override for this run: {d['key']} = {d['value']!r}"
                           + (f" (the spec says {d['spec']!r})" if d.get("spec") else "")),
    "warning": lambda d: f"\n  ⚠ {d['message']}",
    "reaped": lambda d: f"  Removed {d['count']} leftover sandbox container(s) of an earlier run",
    "base_check": lambda d: (f"  Checking the base commit: {d['verdict']}"
                             + (" (cached)" if d.get("cached") else "")),
    "branch_created": lambda d: (f"\nCreating cleaned branch from merge-base...\n"
                                 f"  Base commit: {_short(d['base'])}"),
    "branch_continued": lambda d: (f"\nContinuing cleaned branch {d['branch']} at "
                                   f"{_short(d['tip'])}"),
    "resume": lambda d: f"\nResuming from commit {d['number']}/{d['total']}: {d['subject']}",
    "commit_start": lambda d: f"\nCommit {d['number']}/{d['total']}: {d['subject']}",
    "resolved": lambda d: f"  Resolved: {d['note']}",
    "recovered": lambda d: f"  Recovering an interrupted run: {d['what']}",
    "reverifying": lambda d: f"  Re-verifying {_short(d['sha'])} (recorded before the run "
                             "stopped)",
    "sandbox": lambda d: (f"  Sandbox ready ({d['files']} files, {d['seconds']:.1f}s"
                          + (f", environment {d['environment']}" if d.get("environment")
                             else "") + ")"),
    "setup": lambda d: (f"  Preparing the environment: {d['commands']} setup command(s) on "
                        f"{d['image']}, network {d['network']}"
                        + (f", trusting {d['ca']}" if d.get("ca") else "")
                        + (f"\n    Why: {d['reason']}" if d.get("reason") else "")
                        + (f"\n    Package cache: {d['cache']}" if d.get("cache") else "")),
    "git_metadata": lambda d: (f"  Git metadata: git describe gives {d['tag']}-N-g<hash>, N "
                               f"each commit's distance from {d['tag']} (here {d['distance']});"
                               " the hash part is synthetic: a commit does not exist yet when "
                               "it is tested"),
    "setup_command": lambda d: f"    $ {d['command']}",
    "setup_output": lambda d: f"      {d['line']}",
    "setup_ready": lambda d: (f"  Environment ready: {d['tag']} ({d['seconds']:.1f} s"
                              + (f", the commands {d['commands']:.1f} s)" if "commands" in d
                                 else ")")),
    "setup_cache_pruned": lambda d: f"  Removed a package cache no kept environment uses: "
                                    f"{d['volume']}",
    "setup_pruned": lambda d: f"  Removed an older environment of this repository: {d['tag']}",
    "diff": lambda d: f"  Computing diff ({d['lines']} lines)...",
    "extracting": lambda d: "  Extracting relevant changes...",
    "taking_paths": lambda d: "  Taking paths from source: " + _names(d["paths"]),
    "nothing_to_extract": lambda d: (f"  ⚠ Nothing to extract: {d['reason']}\n"
                                     "    No commit made; the run goes on."),
    "creating_commit": lambda d: f"  Creating commit... {_short(d['sha'])}",
    "build": lambda d: f"  Building... {_verdict(d)}",
    "tests": lambda d: f"  Tests... {_verdict(d)}",
    "failure_output": lambda d: _indent(d["tail"]),
    "assessing": lambda d: "\n  Assessing progress...",
    "fix_attempt": lambda d: f"  Fix attempt {d['attempt']}:",
    "fix_done": lambda d: f"    {d['message']}\n    Creating fixup commit... {_short(d['sha'])}",
    "no_progress": lambda d: f"    No progress: {d['why']}",
    "llm_stuck": lambda d: "  LLM: " + _indent(f'"{d["summary"]}"', "").replace("\n", "\n       "),
    "stopping": lambda d: "\n  ✗ Stuck - stopping",
    "auto_response": lambda d: f"  Using the pre-written response: {d['text']}",
    "commit_complete": lambda d: ("  ✓ Commit created" + _fixes(d["fixes"]) if d.get("created")
                                  else "  ✓ Verified" + _fixes(d["fixes"])),
    "remainder": lambda d: (f"\nRemaining: the commits left {len(d['paths'])} path(s) different "
                            "from source"),
    "assigning": lambda d: "  Assigning them to commits...",
    "remainder_commit": lambda d: (f"\nRemaining changes for commit {d['number']}: "
                                   f"{d['subject']}\n  " + _names(d["paths"])),
    "leftover_commit": lambda d: ("\nUnclaimed changes, in a catch-all commit on top:\n  "
                                  + _names(d["paths"])),
    "leftover": lambda d: ("\n  ⚠⚠ WARNING: the spec's commits did not cover everything. "
                           f"{len(d['paths'])} path(s) went into a final catch-all commit "
                           f"{_short(d['sha'])}:\n" + _indent(_names(d["paths"], "\n"))
                           + "\n    Add them to a [[commit]] (paths or hints) for a clean story."),
    "squash_verify": lambda d: (f"\nVerifying {d['trees']} squashed tree(s) never built as "
                                f"such ({d['jobs']} at a time)..."),
    "squash_tree": lambda d: (f"  #{d['number']} {d['subject']}: {d['verdict']}"
                              + (" (cached)" if d.get("cached") else f" ({d['seconds']:.1f} s)")),
    "squashed": lambda d: f"\nSquashed fix commits: {d['commits']} commits, tip {_short(d['tip'])}",
    "tree_check": lambda d: ("\nTree check: cleaned == source ✓" if d["equal"] else
                             f"\nTree check: ✗ cleaned differs from source in {d['differing']} "
                             "path(s)"),
    "final_verify": lambda d: f"\nFinal tests on the finished tree: {d['command']}",
    "final_tree": lambda d: (f"  Final tree {_short(d['tree'])}: {d['verdict']}"
                             + (" (cached)" if d.get("cached") else f" ({d['seconds']:.1f} s)")
                             + (f"\n{_indent(d['tail'])}" if d.get("tail") else "")),
    "summary": lambda d: _summary(d),
    "heartbeat": progress.line,
}


def _tests(tests: dict[str, Any] | None) -> list[str]:
    """Which trees got which test command: `Tests: 5 commit trees ran `X`, the final tree ran
    `Y` (PASS)`."""
    if not tests:
        return []
    each, final = tests["each_commit"], tests.get("final")
    trees = each["trees"]
    parts = [f"{trees} commit tree{'s' if trees != 1 else ''} ran `{each['command']}`"
             if each["command"] else "no test command on each commit"]
    if final is not None:
        parts.append(f"the final tree ran `{final['command']}` ({final['verdict']}"
                     + (", cached" if final.get("cached") else "") + ")")
    return ["  Tests: " + ", ".join(parts)]


_WHY = {"new file": "new file", "binary": "binary, compared whole",
        "large": "large, compared whole", "link": "link or submodule", "mode": "mode changed"}


def _invented(item: dict[str, Any] | None) -> str:
    """What a flagged path holds: `(+3 lines)`, `(new file, +12 lines)`, `(binary, …)`."""
    if item is None:
        return ""
    parts = [_WHY.get(item["why"], sanitize_name(item["why"]))] if item["why"] else []
    if item["lines"]:
        parts.append(f"+{item['lines']} line{'s' if item['lines'] != 1 else ''}")
    return f" ({', '.join(parts)})" if parts else ""


def _summary(d: dict[str, Any]) -> str:
    code = d.get("exit_code", 0 if d["complete"] else 1)
    lines = ["", "Complete!" if d["complete"] and code == 0 else
             f"Finished, but not complete (exit {code}): see below."]
    if d.get("squashed") and d["fixes"]:
        lines.append(f"  {d['logical']} logical commits, {d['fixes']} fix commit(s) squashed "
                     "into them")
    else:
        lines += [f"  {d['logical']} logical commits created", f"  {d['fixes']} fix commits"]
    on = f" ({d['commits']} commits on {_short(d['base'])})" if d.get("base") else ""
    lines.append(f"  Branch: {d['branch']}{on}")
    for item in d.get("nothing") or ():
        lines.append(f"  Nothing to extract for #{item['number']} {item['subject']}: "
                     + _indent(item["reason"], "    ").lstrip())
    for item in d.get("provenance") or ():
        foreign = set(item["foreign"])
        what = {i["path"]: i for i in item.get("invented") or ()}
        shown = [("⚠ " if p in foreign else "") + sanitize_name(p) + _invented(what.get(p))
                 for p in item["novel"][:8]]
        more = f", … ({len(item['novel']) - 8} more)" if len(item["novel"]) > 8 else ""
        lines.append(f"  Content in neither base nor source, #{item['number']} "
                     f"{item['subject']}: " + ", ".join(shown) + more)
        first = next((i for i in item.get("invented") or () if i["first"]), None)
        if first is not None:
            lines.append(f"    first invented line, {sanitize_name(first['path'])}: "
                         + sanitize_name(first["first"]))
    if any(item["foreign"] for item in d.get("provenance") or ()):
        lines.append("    ⚠ marks paths that exist in neither: check them before you push.")
    lines += _tests(d.get("tests"))
    final = (d.get("tests") or {}).get("final")
    if final is not None and not final["passed"]:
        lines.append("  ✗ The finished tree fails the final tests (output above). It equals the "
                     "source's tree, so the source branch fails them too: fix it there (exit 3).")
    tokens = d.get("tokens") or {}
    if tokens:
        lines.append("  Tokens: " + ", ".join(f"{'#' if k.isdigit() else ''}{k} {v:,}"
                                              for k, v in tokens.items()))
    if d["fixes"] and d.get("base") and not d.get("squashed"):
        lines += ["", "To fold the fix commits into their logical commits, rerun with "
                  "--squash-wip."]
    return "\n".join(lines)


# What --quiet still shows: what went wrong or needs a look, and the outcome.
QUIET_EVENTS = frozenset({"warning", "leftover", "stopping", "llm_stuck", "nothing_to_extract",
                          "tree_check", "summary", "failure_output", "final_tree"})
_verbosity = [0]  # -1 --quiet, 0, 1 --verbose (set once by the command line)


def set_verbosity(level: int) -> None:
    _verbosity[0] = level


def verbosity() -> int:
    return _verbosity[0]


def plain_terminal() -> bool:
    """TERM=dumb or NO_COLOR: no cursor movement, no colour, whatever the terminal."""
    return os.environ.get("TERM") == "dumb" or bool(os.environ.get("NO_COLOR"))


def _detail(event: str, data: dict[str, Any]) -> str:
    """An event only --json shows by default, for --verbose."""
    fields = " ".join(f"{key}={value!r}" for key, value in data.items())
    return f"  [{event}] {fields}"


class HumanReporter:
    """Lines for a person. A `heartbeat` event marked `live` (on a terminal) is one line
    rewritten in place, cleared before anything else is written; emitted from several threads
    (the heartbeat's), so one at a time."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.run_id = RUN_ID
        self._lock = threading.Lock()
        self._live = False  # a live line is on the screen

    def emit(self, event: str, **data: Any) -> None:
        render = FORMATS.get(event)
        if render is None:  # an event for --json only, unless --verbose
            if verbosity() <= 0 or event in ("error", "model_retry"):  # said on stderr
                return
            render = lambda d: _detail(event, d)  # noqa: E731
        elif (verbosity() < 0 and event not in QUIET_EVENTS) or data.get("stderr"):
            return  # not wanted, or said on stderr already
        with self._lock:
            if event == "heartbeat" and data.get("live"):
                self._live_line(data)
                return
            if self._live:
                self.out.write(CLEAR_LINE)
                self._live = False
            self.out.write(sanitize(render(data)) + "\n")
            self.out.flush()

    def _live_line(self, data: dict[str, Any]) -> None:
        """The live line redrawn; an empty one (nothing runs) erases it, when it is there (a
        prompt written since must stay)."""
        text = sanitize(progress.line(data).strip()) if data.get("what") else ""
        if not text and not self._live:
            return
        width = shutil.get_terminal_size().columns - 1
        self.out.write(CLEAR_LINE + (text if len(text) <= width else text[:width - 1] + "…"))
        self.out.flush()
        self._live = bool(text)


CLEAR_LINE = "\r\x1b[2K"  # to the line's start, and erase it


def live_terminal(out: TextIO) -> bool:
    """Whether a live line may be drawn on `out`: a terminal, not plain, not --quiet."""
    return out.isatty() and not plain_terminal() and verbosity() >= 0


@contextlib.contextmanager
def watching(reporter: Reporter, out: TextIO | None, live: bool | None = None
             ) -> Iterator[None]:
    """The run's heartbeat (progress.heartbeat) on `reporter`: a live line when `out` (the
    stream its human lines go to; None for --json) is a terminal, else a line per step every
    RETCON_SANDBOX_HEARTBEAT seconds. Nothing under --quiet."""
    if out is not None and verbosity() < 0:
        yield
        return
    if live is None:
        live = out is not None and live_terminal(out)
    with progress.heartbeat(reporter, live=live):
        yield


def make_reporter(as_json: bool) -> Reporter:
    return JsonReporter() if as_json else HumanReporter()
