"""The facts a job summary and a report show, read (never written) from what a run leaves: the
spec's history, the branches in git, the build and test results in the verification notes, the
tokens and model times in the transcript, and the run's events (summary/runlog.py).

Every string here may come from the repository or its `.git` (subjects, file names, outputs, a
transcript's labels) and is escaped where it is shown (markup.py), never here. A result comes
from the notes: this user's own first, for the commands given when they match; a claim by
others (a line the key does not authenticate) is shown as a claim.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retcon_sandbox.repo import provenance
from retcon_sandbox.repo.checks import revisions
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.spec.file import Spec
from retcon_sandbox.spec.history import (
    Blocked,
    Done,
    Fresh,
    Next,
    commits_created,
    next_step,
)
from retcon_sandbox.spec.statedir import StateDir
from retcon_sandbox.summary.runlog import json_lines, last_run, read_events, read_tail
from retcon_sandbox.verify.cache import Cache, Outcome

LANES = ("setup", "sandbox", "model", "build", "tests")
_STEP = re.compile(r"commit-([1-9][0-9]{0,5})/")
TRANSCRIPT_LIMIT = 64 * 1024 * 1024  # bytes of a transcript read for its tokens and times


@dataclass(frozen=True)
class FileStat:
    path: str
    added: int | None  # None: binary
    removed: int | None


@dataclass(frozen=True)
class Commit:
    """One commit of a branch or range: its change and its recorded result (None: none)."""

    sha: str
    tree: str
    subject: str
    files: tuple[FileStat, ...]
    outcome: Outcome | None
    entry: int | None = None  # the spec's [[commit]] it belongs to
    ran: tuple[str | None, str | None] | None = None  # the build and test of `outcome`

    @property
    def added(self) -> int:
        return sum(f.added or 0 for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed or 0 for f in self.files)


@dataclass(frozen=True)
class Flag:
    """A path given content found in neither the base nor the source (repo/provenance.py)."""

    path: str
    foreign: bool  # exists in neither
    why: str
    lines: int
    first: str


@dataclass(frozen=True)
class Logical:
    """One [[commit]] of the spec."""

    number: int
    subject: str
    state: str
    commits: tuple[str, ...]
    fixes: int
    tokens: int
    flags: tuple[Flag, ...]
    note: str | None  # a stuck summary, or why there was nothing to extract


@dataclass(frozen=True)
class Span:
    lane: str
    start: float  # seconds after the run began
    seconds: float
    label: str


@dataclass(frozen=True)
class Timeline:
    started: float  # the run's start, seconds since the epoch
    wall: float
    spans: tuple[Span, ...]

    def total(self, lane: str) -> float:
        return sum(s.seconds for s in self.spans if s.lane == lane)


@dataclass(frozen=True)
class Facts:
    title: str
    clean: tuple[Commit, ...]  # the cleaned branch, or the range
    messy: tuple[Commit, ...] = ()  # the source branch from the merge-base
    logical: tuple[Logical, ...] = ()
    source: str = ""
    remote: str = ""
    cleaned: str = ""
    base: str = ""
    tree_equal: bool | None = None
    differing: int = 0
    timeline: Timeline | None = None
    commands: tuple[str | None, str | None] = (None, None)
    other_tokens: int = 0  # the model's work outside any one commit (the remainder)
    exit_code: int | None = None  # the newest run's, when it finished (its summary event)

    @property
    def tokens(self) -> int:
        return sum(item.tokens for item in self.logical) + self.other_tokens


# --- results and commits -----------------------------------------------------------------


CommandPair = tuple[str | None, str | None]  # build, test


def result_of(cache: Cache, tree: str, wanted: CommandPair | None
              ) -> tuple[Outcome, CommandPair] | None:
    """The newest result kept for `tree` and the commands it ran: ours before a claim, under
    the `wanted` commands when a result under them exists."""
    found = [(outcome, (key.build, key.test), ours) for key, outcome, ours
             in cache.recorded(tree)]
    if wanted is not None:
        found = [f for f in found if f[1] == wanted] or found
    mine = next(((outcome, ran) for outcome, ran, ours in found if ours), None)
    return mine if mine is not None else (found[0][:2] if found else None)


def commits(repo: Repo, cache: Cache, rows: Sequence[tuple[str, str, str]],
            wanted: CommandPair | None, entries: dict[str, int] | None = None
            ) -> tuple[Commit, ...]:
    """Each (sha, tree, subject) with its diff stat against its first parent and its result."""
    found = []
    for sha, tree, subject in rows:
        parent = repo.parent_of(sha)
        stat = repo.numstat(parent, sha) if parent else []
        result = result_of(cache, tree, wanted)
        found.append(Commit(sha, tree, subject, tuple(FileStat(*s) for s in stat),
                            result[0] if result else None, (entries or {}).get(sha),
                            result[1] if result else None))
    return tuple(found)


def entry_numbers(spec: Spec, rows: Sequence[tuple[str, str, str]]) -> dict[str, int]:
    """Which [[commit]] each branch commit belongs to: the one whose history records it, else
    (a squashed branch) the one whose subject it has, or whose subject it fixes up."""
    recorded = {sha: c.number for c in spec.commits for sha in commits_created(c.history)}
    by_subject = {c.subject: c.number for c in spec.commits}
    found = {}
    for sha, _, subject in rows:
        number = recorded.get(sha) or by_subject.get(subject.removeprefix("fixup! "))
        if number is not None:
            found[sha] = number
    return found


# --- the spec's commits ------------------------------------------------------------------


def state_of(step: Next) -> tuple[str, str | None]:
    """A commit's state in words, and the note that goes with it."""
    if isinstance(step, Done):
        return ("nothing to extract", step.nothing) if step.nothing is not None \
            else ("complete", None)
    if isinstance(step, Blocked):
        return "stuck", step.summary
    if isinstance(step, Fresh):
        return "pending", None
    return "in progress", None


def logical(repo: Repo, spec: Spec, base: str, source: str, tokens: dict[str, int]
            ) -> tuple[Logical, ...]:
    base_entries = repo.ls_tree(repo.tree_of(base))
    source_entries = repo.ls_tree(repo.tree_of(source))
    found = []
    for commit in spec.commits:
        made = [sha for sha in commits_created(commit.history) if repo.exists(sha)]
        state, note = state_of(next_step(commit.history))
        found.append(Logical(commit.number, commit.subject, state, tuple(made),
                             sum(1 for sha in made
                                 if repo.message_of(sha).startswith("fixup! ")),
                             tokens.get(str(commit.number), 0),
                             flags(repo, made, base_entries, source_entries), note))
    return tuple(found)


def flags(repo: Repo, made: list[str], base: dict[str, Any], source: dict[str, Any]
          ) -> tuple[Flag, ...]:
    found = provenance.of_commits(repo, made, base, source)
    what = {i.path: i for i in found.found}
    return tuple(Flag(path, path in found.foreign, what[path].why if path in what else "",
                      what[path].lines if path in what else 0,
                      what[path].first if path in what else "")
                 for path in found.novel)


# --- the transcript and the run's events -------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value < 0:
        return None
    return float(value)


def transcript(path: Path) -> list[dict[str, Any]]:
    """The transcript's records (the end of a large one)."""
    return [r for r in json_lines(read_tail(path, TRANSCRIPT_LIMIT))
            if isinstance(r, dict) and isinstance(r.get("step"), str)]


def tokens_by_commit(records: list[dict[str, Any]]) -> dict[str, int]:
    """Tokens per [[commit]] number ("1", "2", …) and "other", over every run."""
    tokens: dict[str, int] = {}
    for record in records:
        usage = record.get("usage")
        if not isinstance(usage, dict):
            continue
        spent = sum(int(n) for n in (_number(usage.get("prompt_tokens")),
                                     _number(usage.get("completion_tokens"))) if n)
        match = _STEP.match(record["step"])
        key = match.group(1) if match else "other"
        tokens[key] = tokens.get(key, 0) + spent
    return tokens


_EVENT_LANES = {"setup_ready": "setup", "sandbox": "sandbox", "build": "build",
                "tests": "tests", "squash_tree": "tests", "final_tree": "tests",
                "base_check": "tests"}


def _event_spans(events: list[dict[str, Any]], started: float) -> list[Span]:
    """The timed events as spans. An event is emitted when its work ends, with its seconds;
    a commit's `build` is emitted with its `tests`, so it ends where they begin."""
    spans: list[Span] = []
    builds: dict[object, int] = {}  # a commit's number: its build's span, until its tests
    for event in events:
        lane, seconds = _EVENT_LANES.get(event["event"]), _number(event.get("seconds"))
        if lane is None or seconds is None or event.get("cached"):
            continue
        number = event.get("number")
        label = f"#{number} {event['event']}" if isinstance(number, int) else event["event"]
        start = max(0.0, event["time"] - seconds - started)
        if lane == "tests" and number in builds:
            at = builds.pop(number)
            build = spans[at]
            spans[at] = Span("build", max(0.0, start - build.seconds), build.seconds,
                             build.label)
        if lane == "build":
            builds[number] = len(spans)
        spans.append(Span(lane, start, seconds, label.replace("_", " ")))
    return spans


def timeline(events: list[dict[str, Any]], records: list[dict[str, Any]]) -> Timeline | None:
    """Where the newest run's wall time went: its timed events and each of its model
    requests, as spans on their lanes."""
    if not events:
        return None
    started = float(events[0]["time"])
    ended = float(events[-1]["time"])
    spans = _event_spans(events, started)
    for record in records:
        moment, seconds = _number(record.get("time")), _number(record.get("seconds"))
        if moment is not None and seconds is not None and started <= moment <= ended + 1:
            spans.append(Span("model", max(0.0, moment - seconds - started), seconds,
                              str(record["step"])))
    return Timeline(started, max(0.0, ended - started),
                    tuple(sorted(spans, key=lambda s: s.start)))


def tree_check(repo: Repo, tip: str, source: str) -> tuple[bool, int]:
    equal = repo.tree_of(tip) == repo.tree_of(source)
    return equal, 0 if equal else len(repo.changed_paths(tip, source))


# --- the whole -------------------------------------------------------------------------------


def for_spec(repo: Repo, spec: Spec, spec_real: Path, wanted: tuple[str | None, str | None],
             events: list[dict[str, Any]] | None = None) -> Facts:
    """A reconstruction: the cleaned branch beside the source's messy one, each commit's result,
    the spec's commits, and the newest run's timeline (its events given, or read back)."""
    revs = revisions(repo, spec)
    cache = Cache(repo)
    state = StateDir(repo.common_dir())
    records = transcript(state.existing(spec_real, "transcript.jsonl"))
    if events is None:
        events = last_run(read_events(state.existing(spec_real, "events.jsonl")))
    tip = repo.branch_sha(spec.cleaned)
    clean_rows = repo.commits_in(tip, revs.base) if tip and tip != revs.base else []
    tokens = tokens_by_commit(records)
    equal, differing = tree_check(repo, tip, revs.source) if tip else (None, 0)
    return Facts(spec.path.name,
                 commits(repo, cache, clean_rows, wanted, entry_numbers(spec, clean_rows)),
                 commits(repo, cache, repo.commits_in(revs.source, revs.base), wanted),
                 logical(repo, spec, revs.base, revs.source, tokens), spec.source, spec.remote,
                 spec.cleaned, revs.base, equal, differing, timeline(events, records), wanted,
                 tokens.get("other", 0), finished_with(events))


def finished_with(events: list[dict[str, Any]]) -> int | None:
    """The exit code the newest run's summary said (a run that stopped before it has none)."""
    ended = next((e for e in reversed(events) if e.get("event") == "summary"), None)
    code = ended.get("exit_code") if ended else None
    return code if isinstance(code, int) else None


def for_range(repo: Repo, label: str, rows: Sequence[tuple[str, str, str]],
              wanted: tuple[str | None, str | None] | None) -> Facts:
    """A revision range: its commits and their results."""
    return Facts(label, commits(repo, Cache(repo), rows, wanted),
                 commands=wanted or (None, None))


# --- in words (our own text; the renderers escape what comes from the repository) --------------

_WHY = {"new file": "new file", "binary": "binary, compared whole",
        "large": "large, compared whole", "link": "link or submodule", "mode": "mode changed"}


def flag_words(flag: Flag) -> str:
    """What a flagged path holds: `new file, +12 lines`, `+3 lines`, `binary, compared whole`."""
    parts = [_WHY.get(flag.why, "other")] if flag.why else []
    if flag.lines:
        parts.append(f"+{flag.lines} line{'s' if flag.lines != 1 else ''}")
    return ", ".join(parts)


def stage_words(outcome: Outcome | None, which: str) -> str:
    """`PASS 0.4 s`, `FAIL (exit 1) 0.1 s`, `-` (not reached or not run), `none` (no such
    command); `(claim)` when others wrote it."""
    if outcome is None:
        return "not recorded"
    stage = outcome.stage(which)
    if stage is None:
        failed_before = which == "test" and not outcome.passed
        return "-" if failed_before else "none"
    seconds = "" if stage.timed_out else f" {stage.seconds:.1f} s"
    return f"{stage.verdict}{seconds}" + (" (claim)" if outcome.claimed else "")


def final_commit(facts: Facts, item: Logical) -> Commit | None:
    """The commit whose result stands for a [[commit]]: its last one on the branch."""
    mine = [c for c in facts.clean if c.entry == item.number]
    return mine[-1] if mine else None


def outcome_line(facts: Facts) -> tuple[bool, str]:
    """Whether the run is complete, and its outcome in a line."""
    stuck = next((c for c in facts.logical if c.state == "stuck"), None)
    done = all(c.state in ("complete", "nothing to extract") for c in facts.logical)
    fixes = sum(c.fixes for c in facts.logical)
    count = sum(c.state == "complete" for c in facts.logical)
    made = f"{count} of {len(facts.logical)} logical commits, {len(facts.clean)} commits, " \
        f"{fixes} fix{'es' if fixes != 1 else ''}"
    if stuck is not None:
        return False, f"Stopped: #{stuck.number} is stuck ({made})"
    if not done:
        return False, f"Not finished ({made})"
    if facts.exit_code or facts.tree_equal is False:  # never Complete on a run that exits 3
        return False, f"Finished, but not complete: exit {facts.exit_code or 1} ({made})"
    return True, f"Complete ({made})"


def seconds_words(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
