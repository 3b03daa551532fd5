"""History entries and the pure state machine that decides what a commit needs next.

No I/O here: everything is derived from a commit's history list, so a run can stop at any
point and the next run picks up exactly where the file says it was.
"""

from __future__ import annotations

from dataclasses import dataclass

SHA_LEN = 40


@dataclass(frozen=True)
class Started:
    pass


@dataclass(frozen=True)
class Complete:
    pass


@dataclass(frozen=True)
class CommitCreated:
    sha: str


@dataclass(frozen=True)
class Stuck:
    summary: str


@dataclass(frozen=True)
class Resolved:
    note: str


@dataclass(frozen=True)
class Response:
    """A pre-written answer: it resolves the first `stuck` that comes after it."""

    text: str


Entry = Started | Complete | CommitCreated | Stuck | Resolved | Response


# --- what a commit needs next -------------------------------------------------------------


@dataclass(frozen=True)
class Fresh:
    """Nothing done yet."""


@dataclass(frozen=True)
class Done:
    """History ends in `complete`."""


@dataclass(frozen=True)
class Blocked:
    """Stuck with no resolution: a human must add `resolved`."""

    summary: str


@dataclass(frozen=True)
class Extract:
    """Extract this commit's changes (again). `note` is a human's resolution, if any."""

    note: str | None
    stuck: str | None
    interrupted: bool


@dataclass(frozen=True)
class Verify:
    """A commit exists for this entry: build and test it, then fix if needed.

    `expected_tip` is the last commit the history knows; `interrupted` says the run stopped
    before that commit was verified.
    """

    expected_tip: str
    note: str | None
    stuck: str | None
    interrupted: bool


Next = Fresh | Done | Blocked | Extract | Verify


def commits_created(history: list[Entry]) -> list[str]:
    return [e.sha for e in history if isinstance(e, CommitCreated)]


def pending_response(history: list[Entry]) -> Response | None:
    """The newest response not yet used up by a `stuck` written after it."""
    for entry in reversed(history):
        if isinstance(entry, Stuck):
            return None
        if isinstance(entry, Response):
            return entry
    return None


def resolution_note(history: list[Entry]) -> str | None:
    """The note that resolved the newest `stuck`, or None when it is unresolved (or never stuck).

    A `resolved` or `response` written after the stuck resolves it; so does a `response` written
    before it, ahead of time, that no earlier stuck used up.
    """
    last_stuck = max((i for i, e in enumerate(history) if isinstance(e, Stuck)), default=None)
    if last_stuck is None:
        return None
    for entry in reversed(history[last_stuck + 1 :]):
        if isinstance(entry, Resolved):
            return entry.note
        if isinstance(entry, Response):
            return entry.text
    ahead = pending_response(history[:last_stuck])
    return ahead.text if ahead else None


def last_stuck_summary(history: list[Entry]) -> str | None:
    return next((e.summary for e in reversed(history) if isinstance(e, Stuck)), None)


def next_step(history: list[Entry]) -> Next:
    """Derive what a commit needs from its history alone."""
    states = [e for e in history if not isinstance(e, Response)]
    if not states:
        return Fresh()
    last = states[-1]
    if isinstance(last, Complete):
        return Done()
    note = resolution_note(history)
    stuck = last_stuck_summary(history)
    if isinstance(last, Stuck) and note is None:
        return Blocked(last.summary)
    created = commits_created(history)
    interrupted = isinstance(last, (Started, CommitCreated))
    if created:
        return Verify(created[-1], note, stuck, interrupted)
    return Extract(note, stuck, interrupted)
