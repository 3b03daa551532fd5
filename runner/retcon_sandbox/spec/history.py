"""History entries, and the pure decisions made from them: what a commit needs next, and what to
do after a failed build or test run.

No I/O here: everything is derived from a commit's history (and, for the fix loop, from facts
about its commits that the caller reads from git), so a run can stop at any point and the next
run picks up exactly where the file says it was, with the same budgets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

# --- the entries, and the one table that describes them ---------------------------------------


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


@dataclass(frozen=True)
class NothingToExtract:
    """Earlier commits already hold everything this commit asked for: no commit is made."""

    reason: str


Entry = Started | Complete | CommitCreated | Stuck | Resolved | Response | NothingToExtract

HEX40 = re.compile(r"[0-9a-f]{40}")
PROVENANCE_PREFIX = "Provenance:"  # how a --strict-provenance stop's summary begins


@dataclass(frozen=True)
class Kind:
    key: str  # a bare string ("started") or the one key of an inline table
    cls: type[Entry]
    bare: bool
    by: str  # who writes it: "tool" or "you"
    meaning: str
    pattern: re.Pattern[str] | None = None  # what a table entry's value must look like
    expected: str = "a string"

    def make(self, value: str = "") -> Entry:
        return self.cls() if self.bare else self.cls(value)  # type: ignore[call-arg]


KINDS: tuple[Kind, ...] = (
    Kind("started", Started, True, "tool", "work on this commit began"),
    Kind("commit_created", CommitCreated, False, "tool",
         "a commit (the logical one, then its `fixup!`s)", HEX40, "a full 40-hex commit sha"),
    Kind("complete", Complete, True, "tool", "build and tests passed; the run moves on"),
    Kind("nothing_to_extract", NothingToExtract, False, "tool",
         "earlier commits already hold this commit's changes; no commit was made"),
    Kind("stuck", Stuck, False, "tool",
         "the model (or the loop's budget) cannot make progress; the run stops"),
    Kind("resolved", Resolved, False, "you",
         "after a `stuck`: what you changed; the note goes to the model"),
    Kind("response", Response, False, "you",
         "a pre-written answer: it resolves the next `stuck` of this commit without stopping"),
)
BY_KEY = {kind.key: kind for kind in KINDS}
BY_CLASS = {kind.cls: kind for kind in KINDS}


def kind_of(entry: Entry) -> Kind:
    return BY_CLASS[type(entry)]


def value_of(entry: Entry) -> str | None:
    """The string a table entry carries (None for the bare ones)."""
    own = fields(entry)
    return str(getattr(entry, own[0].name)) if own else None


# --- reading a history ---------------------------------------------------------------------


def commits_created(history: Sequence[Entry]) -> list[str]:
    return [e.sha for e in history if isinstance(e, CommitCreated)]


def pending_response(history: Sequence[Entry]) -> Response | None:
    """The newest response not yet used up by a `stuck` written after it."""
    for entry in reversed(history):
        if isinstance(entry, Stuck):
            return None
        if isinstance(entry, Response):
            return entry
    return None


def resolution_note(history: Sequence[Entry]) -> str | None:
    """The note that resolved the newest `stuck`, or None when it is unresolved (or never stuck).

    A `resolved` or `response` written after the stuck resolves it; so does a `response` written
    before it, ahead of time, that no earlier stuck used up.
    A --strict-provenance stop is resolved by a `resolved` only: a human looks at what the
    commit brings after it stopped; no answer written beforehand can do that.
    """
    last_stuck = _last_index(history, Stuck)
    if last_stuck is None:
        return None
    human_only = is_provenance_stop(history[last_stuck])
    for entry in reversed(history[last_stuck + 1 :]):
        if isinstance(entry, Resolved):
            return entry.note
        if isinstance(entry, Response) and not human_only:
            return entry.text
    ahead = None if human_only else pending_response(history[:last_stuck])
    return ahead.text if ahead else None


def is_provenance_stop(entry: Entry) -> bool:
    return isinstance(entry, Stuck) and entry.summary.startswith(PROVENANCE_PREFIX)


def provenance_release(history: Sequence[Entry]) -> str | None:
    """The note of the `resolved` that released the newest --strict-provenance stop, or None.

    Only a `resolved` written after that stop releases it, and only while no commit was made
    since: a new commit is new content, which a human has not looked at yet.
    """
    last_stuck = _last_index(history, Stuck)
    if last_stuck is None or not is_provenance_stop(history[last_stuck]):
        return None
    after = history[last_stuck + 1 :]
    if any(isinstance(e, CommitCreated) for e in after):
        return None
    return next((e.note for e in reversed(after) if isinstance(e, Resolved)), None)


def last_stuck_summary(history: Sequence[Entry]) -> str | None:
    return next((e.summary for e in reversed(history) if isinstance(e, Stuck)), None)


def _last_index(history: Sequence[Entry], cls: type[Entry]) -> int | None:
    return max((i for i, e in enumerate(history) if isinstance(e, cls)), default=None)


def sequence_problems(history: Sequence[Entry]) -> list[str]:
    """Entries that cannot follow each other (index, what is wrong), for the spec's checks."""
    problems = []
    stuck = False
    commits = 0
    for i, entry in enumerate(history):
        if isinstance(entry, Stuck):
            stuck = True
        elif isinstance(entry, Resolved):
            if not stuck:
                problems.append(f"history[{i}]: `resolved` with no `stuck` before it to resolve")
            stuck = False
        elif isinstance(entry, CommitCreated):
            commits += 1
        elif isinstance(entry, Complete) and commits == 0:
            problems.append(f"history[{i}]: `complete` before any `commit_created`")
    return problems


# --- what a commit needs next ----------------------------------------------------------------


@dataclass(frozen=True)
class Fresh:
    """Nothing done yet."""


@dataclass(frozen=True)
class Done:
    """History ends in `complete` (or `nothing_to_extract`, whose reason is given)."""

    nothing: str | None = None


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


def next_step(history: Sequence[Entry]) -> Next:
    """Derive what a commit needs from its history alone."""
    states = [e for e in history if not isinstance(e, Response)]
    if not states:
        return Fresh()
    last = states[-1]
    if isinstance(last, Complete):
        return Done()
    if isinstance(last, NothingToExtract):
        return Done(last.reason)
    note = resolution_note(history)
    stuck = last_stuck_summary(history)
    if isinstance(last, Stuck) and note is None:
        return Blocked(last.summary)
    created = commits_created(history)
    interrupted = isinstance(last, (Started, CommitCreated))
    if created:
        return Verify(created[-1], note, stuck, interrupted)
    return Extract(note, stuck, interrupted)


# --- the fix loop's decisions ----------------------------------------------------------------


@dataclass(frozen=True)
class Budgets:
    max_fixes: int = 10  # fix commits per attempt (an attempt ends when a human resolves)
    no_progress: int = 3  # fixes that return to a tree already tried


@dataclass(frozen=True)
class Made:
    """What the repository says of a commit the history records."""

    tree: str
    parent_tree: str
    fix: bool  # a `fixup!` made by the fix loop


@dataclass(frozen=True)
class TryFix:
    attempt: int  # 1-based, within the current attempt


NO_MODEL_PREFIX = "The build or tests fail and no model is configured to fix them"


@dataclass(frozen=True)
class GiveUp:
    summary: str


def attempt_commits(history: Sequence[Entry]) -> list[str]:
    """The commits of the current attempt: those after the last `stuck` (a run only goes on
    past one that a human resolved) and after the last `complete` (a remainder fixup starts an
    attempt of its own)."""
    last = max((i for i, e in enumerate(history) if isinstance(e, Stuck | Complete)), default=-1)
    return commits_created(history[last + 1 :])


def after_failure(history: Sequence[Entry], made: Mapping[str, Made], has_model: bool,
                  budgets: Budgets, failure: str) -> TryFix | GiveUp:
    """A build or test run failed: try a fix, or give up (a `stuck` with this summary)."""
    if not has_model:
        return GiveUp(f"{NO_MODEL_PREFIX}:\n{failure}")
    commits = [made[sha] for sha in attempt_commits(history) if sha in made]
    fixes = [c for c in commits if c.fix]
    if len(fixes) >= budgets.max_fixes:
        return GiveUp(f"Still failing after {len(fixes)} fix attempts:\n" + failure)
    seen = {commits[0].parent_tree} if commits else set()
    repeats = 0
    for commit in commits:
        if commit.fix and commit.tree in seen:
            repeats += 1
        seen.add(commit.tree)
    if repeats >= budgets.no_progress:
        return GiveUp(f"No progress: {repeats} fixes left the tree unchanged or returned to an "
                      "earlier tree.\n" + failure)
    return TryFix(len(fixes) + 1)


# --- squashing's decisions -------------------------------------------------------------------


def passed_commits(history: Sequence[Entry]) -> list[str]:
    """The commits whose build and tests passed: the newest commit before each `complete`."""
    passed = []
    newest = None
    for entry in history:
        if isinstance(entry, CommitCreated):
            newest = entry.sha
        elif isinstance(entry, Complete) and newest is not None:
            passed.append(newest)
    return passed


@dataclass(frozen=True)
class SquashedTree:
    """One commit of the squashed branch: its spec entry and what its tree gave."""

    number: int
    subject: str
    passed: bool


@dataclass(frozen=True)
class MoveBranch:
    pass


@dataclass(frozen=True)
class KeepBranch:
    """The branch stays unsquashed. `stuck`: a squashed tree fails (a human decides what to do);
    otherwise the squash itself is wrong (a bug: the final tree would change)."""

    summary: str
    stuck: bool
    failing: tuple[int, ...] = ()


def squash_check(final_tree: str, tip_tree: str, trees: Sequence[SquashedTree]
                 ) -> MoveBranch | KeepBranch:
    """Whether the squashed branch may replace the unsquashed one: only with the same final
    tree, and when every squashed commit's tree passed."""
    if final_tree != tip_tree:
        return KeepBranch("squashing would change the final tree", stuck=False)
    failing = [t for t in trees if not t.passed]
    if failing:
        names = ", ".join(f"#{t.number} ({t.subject})" for t in failing)
        return KeepBranch(f"squashed commit{'s' if len(failing) > 1 else ''} {names} "
                          f"fail{'' if len(failing) > 1 else 's'} the build or tests",
                          stuck=True, failing=tuple(t.number for t in failing))
    return MoveBranch()
