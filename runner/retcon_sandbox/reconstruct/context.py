"""What one run works with, and the few operations that write: append a history entry, make a
commit on the cleaned branch, record a stuck commit. The steps (`extract`, `fixloop`,
`remainder`, `squash`) are functions over this context; `engine` drives them.

Order of writes for a commit: objects first, then the `commit_created` entry, then the branch
moves by compare-and-swap. A run killed between the last two is recovered on resume.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from retcon_sandbox import progress
from retcon_sandbox.backends.api import Backend, Sandbox
from retcon_sandbox.backends.environments import Environments, Warming
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import RetconError
from retcon_sandbox.model.tools import ToolOutcome
from retcon_sandbox.pipeline import Pipeline
from retcon_sandbox.reconstruct import ownership
from retcon_sandbox.repo import provenance
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.repo.provenance import Provenance
from retcon_sandbox.report import Reporter
from retcon_sandbox.spec.file import CommitSpec, Spec, SpecFile
from retcon_sandbox.spec.history import (
    PROVENANCE_PREFIX,
    Budgets,
    CommitCreated,
    Entry,
    Extract,
    Stuck,
    Verify,
    commits_created,
    next_step,
)
from retcon_sandbox.spec.settings import SandboxSettings
from retcon_sandbox.spec.statedir import StateDir
from retcon_sandbox.verify.stages import Verifier

if TYPE_CHECKING:  # openai loads only when a model is named (commands/setup.make_agent)
    from retcon_sandbox.model.agent import Agent

AskNote = Callable[[CommitSpec, str], str | None]


@dataclass(frozen=True)
class RunOptions:
    squash_wip: bool = False
    budgets: Budgets = field(default_factory=Budgets)
    strict_provenance: bool = False
    jobs: int = 1
    reuse: bool = True  # the squash check's used sandboxes may take another tree, once wiped
    accept_provenance: bool = False  # releases the --strict-provenance stops already recorded
    adopt_branch: bool = False  # work on an existing cleaned branch this spec did not create
    base_check: bool = True  # the base commit explains a first failure (--no-base-check: not)
    pipeline: Pipeline = Pipeline.OFF  # what overlaps a commit's build and tests


class Buffered:
    """A reporter that keeps what it is told, for a speculation: shown where a serial run
    would have shown it when the speculation is kept, dropped when it is not."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, **data: Any) -> None:
        self.events.append((event, data))

    @staticmethod
    def replay(events: list[tuple[str, dict[str, Any]]], to: Reporter) -> None:
        """Held events, as they were emitted (each checked there, see tests/commands)."""
        for event, data in events:
            to.emit(event, **data)


class Held:
    """A reporter for work begun ahead in a thread (the model's check, see
    `commands.execute.model_ahead`): its events wait, and go to `to` in their order when the
    run takes the work's result (`release`), after the events the run made meanwhile; from then
    on it is `to`. A run that ends before taking it never shows them: its last event stays its
    own."""

    def __init__(self, to: Reporter) -> None:
        self.to = to
        self.run_id = to.run_id
        self._held: list[tuple[str, dict[str, Any]]] | None = []
        self._lock = threading.Lock()

    def emit(self, event: str, **data: Any) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append((event, data))
                return
        self.to.emit(event, **data)

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
        Buffered.replay(held, self.to)


@dataclass
class Speculation:
    """Commit `number` begun ahead, on the tree `base_tree` (the previous commit's, as it was
    being built and tested): its sandbox, open on that tree, and what the model answered
    (None for a `paths` commit, or when no model was asked). Nothing of it is in the spec or
    on the branch; git objects only."""

    number: int
    base_tree: str
    state: WorkState
    stack: contextlib.ExitStack
    outcome: ToolOutcome | None
    events: list[tuple[str, dict[str, Any]]]
    tokens: int


@dataclass
class Run:
    specfile: SpecFile
    spec: Spec
    repo: Repo
    backend: Backend
    verifier: Verifier
    agent: Agent | None
    report: Reporter
    options: RunOptions
    settings: SandboxSettings
    envs: Environments
    ask: AskNote | None = None
    source: str = ""
    final: Verifier | None = None  # `[sandbox] test_final`: the finished branch's check
    state: StateDir | None = None  # the repository's state directory (the preflight's stamps)
    base: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    speculation: Speculation | None = None  # see steps/speculate.py
    retiring: list[threading.Thread] = field(default_factory=list)  # sandboxes being removed
    retire_errors: list[Exception] = field(default_factory=list)
    appended: list[tuple[int, Entry]] = field(default_factory=list)  # this run's, in order
    base_checked: bool = False  # this run built and tested the base (steps/basecheck.py)
    handover: Warming | None = None  # the preflight's sandbox, for the first commit to take
    pending_agent: Callable[[], Agent | None] | None = None  # `agent`, being made: model_ready
    _source_entries: dict[str, TreeEntry] | None = None
    _base_entries: dict[str, TreeEntry] | None = None
    _entries_at: dict[str, dict[str, TreeEntry]] = field(default_factory=dict)

    def model_ready(self) -> None:
        """`agent`, once the thread making it is done: its adapter made and checked by one
        request (`commands.options.make_agent`) while the run's checks went on and its first
        sandbox opened. Raises what that check raised. The driver asks before anything is
        written, and before a setup, which can take minutes, runs."""
        pending, self.pending_agent = self.pending_agent, None
        if pending is not None:
            self.agent = pending()

    # -- reading -----------------------------------------------------------------------------

    def tip(self) -> str:
        tip = self.repo.branch_sha(self.spec.cleaned)
        if tip is None:
            raise RetconError(f"the cleaned branch {self.spec.cleaned!r} disappeared during the "
                              "run", "Rerun: it is recreated and the run resumes from the spec.")
        return tip

    @property
    def spec_id(self) -> ownership.SpecId:
        return ownership.spec_id(self.specfile.real)

    def commit_spec(self, number: int) -> CommitSpec:
        return self.spec.commits[number - 1]

    def source_entries(self) -> dict[str, TreeEntry]:
        if self._source_entries is None:
            self._source_entries = self.repo.ls_tree(self.repo.tree_of(self.source))
        return self._source_entries

    def entries_at(self, commit: str) -> dict[str, TreeEntry]:
        if commit not in self._entries_at:
            self._entries_at[commit] = self.repo.ls_tree(self.repo.tree_of(commit))
        return self._entries_at[commit]

    def versions(self, commit: CommitSpec, tree: str) -> dict[str, TreeEntry | None]:
        """The files `commit` takes as a commit of the source branch had them (`versions`),
        those that differ from `tree`: path -> that commit's entry (None: it had no such file)."""
        if not commit.versions:
            return {}
        now = self.repo.ls_tree(tree)
        wanted = {path: self.entries_at(sha).get(path) for path, sha in commit.versions}
        return {path: entry for path, entry in wanted.items() if now.get(path) != entry}

    def provenance(self, commit: CommitSpec) -> Provenance:
        """The paths this logical commit's commits gave content found in neither the base nor
        the source (see `provenance`); a file it takes at a version is judged against that
        version."""
        if self._base_entries is None:
            self._base_entries = self.repo.ls_tree(self.repo.tree_of(self.base))
        made = [sha for sha in commits_created(commit.history) if self.repo.exists(sha)]
        theirs = dict(self.source_entries())
        for path, sha in commit.versions:
            entry = self.entries_at(sha).get(path)
            if entry is not None:
                theirs[path] = entry
        return provenance.of_commits(self.repo, made, self._base_entries, theirs)

    @contextlib.contextmanager
    def sandbox(self, label: str, number: int | None = None, warming: Warming | None = None,
                tip: str | None = None) -> Iterator[WorkState]:
        """A working state on the cleaned branch's tip (for commit `number`, if it is one
        commit's); its sandbox opens on first use, from the environment prepared for the tree
        it holds, and is removed when the block exits (or when another one replaces it).
        `warming`: a sandbox already being opened (`Environments.warm`), used if its tree is
        the one needed first. `tip`: the tip as this step has just read it (else read now)."""
        with contextlib.ExitStack() as stack:
            current: list[contextlib.ExitStack] = []
            if warming is not None:
                stack.callback(warming.close)
            ahead = [warming] if warming is not None else []

            def open_box(tree: str) -> Sandbox:
                for previous in current:
                    previous.close()
                current.clear()
                inner = stack.enter_context(contextlib.ExitStack())
                current.append(inner)
                started = time.monotonic()
                warm = ahead.pop() if ahead else None
                taken = {}  # the preflight's sandbox, taken over: said so
                with progress.phase(self.report, "sandbox", number):
                    if warm is not None and warm.tree == tree:
                        inner.callback(warm.close)
                        opened = warm.take()
                        taken = {"preflight": True} if warm.preflight else {}
                    else:
                        if warm is not None:
                            warm.close()
                        opened = inner.enter_context(self.envs.sandbox(
                            label, tree, self.place(tree, number)))
                where = {} if number is None else {"number": number}
                self.report.emit("sandbox", **where, files=opened.files,
                                 seconds=time.monotonic() - started,
                                 environment=opened.environment, **taken)
                return opened.box

            def retree(box: Sandbox, tree: str) -> None:
                self.envs.retree(box, tree, self.place(tree, number))

            yield WorkState(self.repo, open_box, self.repo.tree_of(tip or self.tip()), self.source,
                            self.settings.max_file_size, self.envs.key, retree)

    def take_handover(self) -> Warming | None:
        """The preflight's sandbox, once: the first commit's to use if its tree is the one it
        needs first (`sandbox`), else it is removed there."""
        found, self.handover = self.handover, None
        return found

    def drop_handover(self) -> None:
        found, self.handover = self.handover, None
        if found is not None:
            found.close()

    def place(self, tree: str, number: int | None, tip: str | None = None) -> tuple[str, int]:
        """Where a sandbox's tree sits, for its git metadata's version: the cleaned branch's
        tip when commit `number` verifies the tip's own tree, else the commit made on the tip
        next. (A fix made in an open sandbox keeps the version it opened with.) `tip`: the tip
        as this step has just read it (else read now)."""
        tip = tip or self.tip()
        verifying = number is not None and \
            isinstance(next_step(self.commit_spec(number).history), Verify)
        return tip, 0 if verifying and tree == self.repo.tree_of(tip) else 1

    # -- writing -----------------------------------------------------------------------------

    def append(self, commit: CommitSpec, entry: Entry) -> CommitSpec:
        self.spec, updated = self.specfile.append(commit, entry)
        self.appended.append((commit.number, entry))
        return updated

    def what_was_recorded(self) -> str:
        """What this run wrote into the spec, in a sentence that is true wherever it stopped
        (said after an error's hint)."""
        name = self.spec.path.name
        if not self.appended:
            return f"This run recorded nothing in {name}."
        numbers = sorted({number for number, _ in self.appended})
        made = sum(isinstance(entry, CommitCreated) for _, entry in self.appended)
        which = f"#{numbers[0]}" if len(numbers) == 1 else f"#{numbers[0]} to #{numbers[-1]}"
        commits = f"; {made} commit(s) made on {self.spec.cleaned}" if made else ""
        entries = "entry" if len(self.appended) == 1 else "entries"
        return (f"This run recorded {len(self.appended)} history {entries} in {name} (commit "
                f"{which}{commits}): they are kept, and a rerun goes on from them.")

    def make_commit(self, commit: CommitSpec, state: WorkState, message: str
                    ) -> tuple[CommitSpec, str]:
        """The working state as a commit on the cleaned branch, recorded in the history; the
        updated commit and the new commit's sha."""
        tip = self.tip()
        tree = state.tree()
        sha = self.repo.commit_tree(tree, tip, message)
        commit = self.append(commit, CommitCreated(sha))
        self.move_branch(sha, tip, f"commit #{commit.number}")
        state.committed(tree)
        return commit, sha

    def move_branch(self, new: str, old: str | None, reason: str) -> None:
        """Move the cleaned branch by compare-and-swap; its reflog names this spec
        (`ownership`)."""
        self.repo.update_branch(self.spec.cleaned, new, old, ownership.tag(reason, self.spec_id))

    def stuck(self, commit: CommitSpec, summary: str, provenance: bool = False) -> CommitSpec:
        """Record a stop. Only the --strict-provenance gate (`provenance`) writes a summary with
        its prefix: a model's summary that begins the same way is marked as the model's."""
        if not provenance and summary.startswith(PROVENANCE_PREFIX):
            summary = f"(reported by the model) {summary}"
        commit = self.append(commit, Stuck(summary))
        step = next_step(list(commit.history))
        if isinstance(step, Extract | Verify) and step.note:
            self.report.emit("auto_response", number=commit.number, text=step.note)
        else:
            self.report.emit("stuck", number=commit.number, summary=summary)
        return commit

    def add_tokens(self, key: str, total: int) -> None:
        self.tokens[key] = self.tokens.get(key, 0) + total
