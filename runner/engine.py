"""The reconstruction loop. It drives the pure state machine in `history`: every action appends
exactly one entry to the spec, and the next action is derived from the history again, so a run
can stop anywhere and the next run goes on from the file.

Order of writes for a commit: objects first, then the `commit_created` entry, then the branch
moves by compare-and-swap. A run killed between the last two is recovered on resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.agent import Agent, Assigned, Assignments, Committed, GaveUp, prompt
from runner.errors import ModelError, RetconError, StuckError
from runner.gitrepo import FileChange, Repo, TreeEntry
from runner.history import (
    Blocked,
    CommitCreated,
    Complete,
    Done,
    Entry,
    Extract,
    Fresh,
    Resolved,
    Started,
    Stuck,
    Verify,
    commits_created,
    next_step,
)
from runner.paths import matches
from runner.report import Reporter
from runner.sandbox_api import Backend
from runner.spec import CommitSpec, Spec, SpecFile
from runner.tools import ASSIGN_TOOLS
from runner.workspace import Commands, WorkState, describe

TAIL_LINES = 15


@dataclass(frozen=True)
class RunOptions:
    build: str | None = None
    test: str | None = None
    skip: frozenset[str] = frozenset()
    timeout: float = 600
    squash_wip: bool = False
    max_fixes: int = 10
    no_progress_limit: int = 3


@dataclass
class Counters:
    """Per logical commit, for this run: fix attempts and trees already seen."""

    fixes: int = 0
    no_progress: int = 0
    seen: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Result:
    complete: bool
    trees_equal: bool


AskNote = Callable[[CommitSpec, str], str | None]


class Engine:
    def __init__(self, specfile: SpecFile, spec: Spec, repo: Repo, backend: Backend,
                 agent: Agent | None, reporter: Reporter, options: RunOptions,
                 ask: AskNote | None = None) -> None:
        self.specfile = specfile
        self.repo = repo
        self.backend = backend
        self.agent = agent
        self.report = reporter
        self.options = options
        self.ask = ask
        self.spec = spec
        self.tokens: dict[str, int] = {}
        self._source_entries: dict[str, TreeEntry] | None = None
        self.source = ""
        self.base = ""

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> Result:
        spec = self.spec
        self.source = self.repo.resolve(spec.source)
        remote = self.repo.resolve(spec.remote)
        self.base = self.repo.merge_base(self.source, remote)
        self._prepare_branch()
        reaped = self.backend.reap()
        if reaped:
            self.report.emit("reaped", count=reaped)
        for number in range(1, len(self.spec.commits) + 1):
            self._process(self.spec.commits[number - 1])
        return self._finish()

    def _prepare_branch(self) -> None:
        cleaned = self.spec.cleaned
        if self.repo.head_branch() == cleaned:
            raise RetconError(f"the cleaned branch {cleaned!r} is checked out in {self.repo.root}",
                              "Switch to another branch first: retcon-sandbox never touches your "
                              "working tree, so it will not move a branch that is checked out.")
        tip = self.repo.branch_sha(cleaned)
        if tip is None:
            self.repo.update_branch(cleaned, self.base, None, "create at merge-base")
            self.report.emit("branch_created", branch=cleaned, base=self.base)
            return
        if not self.repo.is_ancestor(self.base, tip):
            raise RetconError(
                f"the cleaned branch {cleaned!r} ({tip[:12]}) does not descend from the "
                f"merge-base of {self.spec.source} and {self.spec.remote} ({self.base[:12]})",
                f"Delete it (git branch -D {cleaned}) or name another `cleaned` branch in the "
                "spec.")
        self.report.emit("branch_continued", branch=cleaned, tip=tip)

    def _tip(self) -> str:
        tip = self.repo.branch_sha(self.spec.cleaned)
        if tip is None:
            raise RetconError(f"the cleaned branch {self.spec.cleaned!r} disappeared during the "
                              "run", "Rerun: it is recreated and the run resumes from the spec.")
        return tip

    # -- one logical commit --------------------------------------------------------------------

    def _process(self, commit: CommitSpec) -> None:
        step = next_step(list(commit.history))
        total = len(self.spec.commits)
        if isinstance(step, Done):
            return
        event = "commit_start" if isinstance(step, Fresh) else "resume"
        self.report.emit(event, number=commit.number, total=total, subject=commit.subject)
        if isinstance(step, Blocked):
            commit = self._unblock(commit, step, previously=True)
        if isinstance(step, Verify):
            self._recover(commit, step)
        tip = self._tip()
        started = time.monotonic()
        with self.backend.open(f"commit-{commit.number}") as box:
            tree = self.repo.tree_of(tip)
            state = WorkState(self.repo, box, tree, self.source, self._commands())
            files = box.load_tree(self.repo.tar_of_tree(tree))
            self.report.emit("sandbox", files=files, seconds=time.monotonic() - started)
            self._loop(commit, state)

    def _loop(self, commit: CommitSpec, state: WorkState, resumed: bool = True) -> None:
        counters = Counters(seen={state.base_tree})
        first = resumed
        while True:
            step = next_step(list(commit.history))
            if isinstance(step, Verify) and step.interrupted and first:
                self.report.emit("recovered", what=f"re-verifying {step.expected_tip[:7]}")
            first = False
            if isinstance(step, Done):
                self.report.emit("commit_complete", number=commit.number,
                                 fixes=self._fixes(commit))
                return
            if isinstance(step, Blocked):
                commit = self._unblock(commit, step)
            elif isinstance(step, Fresh):
                commit = self._append(commit, Started())
            elif isinstance(step, Extract):
                if step.note:
                    self.report.emit("resolved", note=step.note)
                commit = self._extract(commit, state, step)
            elif isinstance(step, Verify):
                commit = self._verify(commit, state, step, counters)

    def _recover(self, commit: CommitSpec, step: Verify) -> None:
        tip = self._tip()
        expected = step.expected_tip
        if tip == expected or self.repo.is_ancestor(expected, tip):
            return
        if self.repo.exists(expected) and self.repo.parent_of(expected) == tip:
            self.repo.update_branch(self.spec.cleaned, expected, tip, "finish interrupted update")
            self.report.emit("recovered", what=f"moved {self.spec.cleaned} to {expected[:7]}")
            return
        raise RetconError(
            f"commit #{commit.number}'s last recorded commit {expected[:12]} is not on the cleaned "
            f"branch {self.spec.cleaned!r} (tip {tip[:12]})",
            "Reset the branch to that commit, or remove the entries after the last `complete` "
            "from this commit's history, then rerun.")

    def _unblock(self, commit: CommitSpec, step: Blocked, previously: bool = False
                 ) -> CommitSpec:
        note = self.ask(commit, step.summary) if self.ask else None
        if note:
            self.report.emit("resolved", note=note)
            return self._append(commit, Resolved(note))
        message = f"commit #{commit.number} ({commit.subject}) is stuck: {step.summary}"
        if previously:
            message = ("Previously stuck - add a `resolved` entry to continue\n"
                       f"  commit #{commit.number} ({commit.subject}): {step.summary}")
        raise StuckError(
            message,
            f"Edit {self.spec.path.name} and add after the `stuck` entry:\n"
            '    { resolved = "description of what you changed" }\n'
            "then rerun the same command.")

    # -- extraction -------------------------------------------------------------------------

    def _extract(self, commit: CommitSpec, state: WorkState, step: Extract) -> CommitSpec:
        working = state.tree()
        diff = self.repo.diff(working, self.source)
        self.report.emit("diff", lines=len(diff.splitlines()))
        if commit.paths is not None:
            return self._take_paths(commit, state)
        self.report.emit("extracting")
        task = prompt("extract", number=commit.number, total=len(self.spec.commits),
                      message=commit.message, hints=commit.hints or "(none)",
                      diff_lines=len(diff.splitlines()),
                      diffstat=self.repo.diff_stat(working, self.source) or "(empty)",
                      resolution=self._resolution(step.stuck, step.note))
        outcome = self._ask_model(commit, state, task, "extract")
        if isinstance(outcome, GaveUp):
            return self._stuck(commit, outcome.summary)
        return self._commit(commit, state, commit.message)

    def _take_paths(self, commit: CommitSpec, state: WorkState) -> CommitSpec:
        assert commit.paths is not None
        changed = [p for p in self.repo.changed_paths(state.tree(), self.source)
                   if matches(p, commit.paths)]
        if not changed:
            return self._stuck(commit, "None of this commit's paths (" + ", ".join(commit.paths)
                               + ") differ between the cleaned branch and the source branch.")
        self.report.emit("taking_paths", paths=changed)
        self._take_from_source(state, changed)
        return self._commit(commit, state, commit.message)

    def _take_from_source(self, state: WorkState, paths: list[str]) -> None:
        """Set `paths` to their state on the source branch, from its own objects."""
        if self._source_entries is None:
            self._source_entries = self.repo.ls_tree(self.repo.tree_of(self.source))
        for path in paths:
            state.put(path, self._source_entries.get(path))

    # -- verification and fixes ---------------------------------------------------------------

    def _verify(self, commit: CommitSpec, state: WorkState, step: Verify,
                counters: Counters) -> CommitSpec:
        failure = self._build_and_test(state)
        if failure is None:
            return self._append(commit, Complete())
        if counters.fixes >= self.options.max_fixes:
            return self._stuck(commit, f"Still failing after {counters.fixes} fix attempts:\n"
                               + failure)
        if self.agent is None:
            return self._stuck(commit, "The build or tests fail and no model is configured to "
                               "fix them:\n" + failure)
        counters.fixes += 1
        self.report.emit("assessing")
        self.report.emit("fix_attempt", attempt=counters.fixes)
        working = state.tree()
        diff = self.repo.diff(working, self.source)
        task = prompt("fix", number=commit.number, total=len(self.spec.commits),
                      subject=commit.subject, attempt=counters.fixes, failure=failure,
                      hints=commit.hints or "(none)", diff_lines=len(diff.splitlines()),
                      diffstat=self.repo.diff_stat(working, self.source) or "(empty)",
                      resolution=self._resolution(step.stuck, step.note))
        outcome = self._ask_model(commit, state, task, f"fix-{counters.fixes}")
        if isinstance(outcome, GaveUp):
            return self._stuck(commit, outcome.summary)
        tree = state.tree()
        if tree in counters.seen:
            counters.no_progress += 1
            self.report.emit("no_progress", why="the fix returned to an earlier tree")
            if counters.no_progress >= self.options.no_progress_limit:
                return self._stuck(commit, f"No progress: {counters.no_progress} fixes left the "
                                   "tree unchanged or returned to an earlier tree.\n" + failure)
        counters.seen.add(tree)
        return self._commit(commit, state, f"fixup! {commit.subject}\n\n{outcome.message}",
                            fix_message=outcome.message)

    def _build_and_test(self, state: WorkState) -> str | None:
        """Run build then tests; the failure as text for the model, or None when both pass."""
        for which, event, title in (("build", "build", "Build"), ("test", "tests", "Tests")):
            if which in self.options.skip:
                self.report.emit(event, verdict="skipped (--skip)")
                continue
            result = state.run(which)
            if result is None:
                self.report.emit(event, verdict=f"skipped (no {which} command)")
                continue
            self.report.emit(event, verdict=result.verdict(), seconds=result.seconds)
            if not result.passed:
                tail = "\n".join(result.output.rstrip().splitlines()[-TAIL_LINES:])
                self.report.emit("failure_output", tail=tail)
                return describe(result, title)
        return None

    # -- the pieces that write ------------------------------------------------------------------

    def _ask_model(self, commit: CommitSpec, state: WorkState, task: str, label: str
                   ) -> Committed | GaveUp:
        assert self.agent is not None
        try:
            outcome, usage = self.agent.run(state, task, f"commit-{commit.number}/{label}")
        except ModelError as exc:
            return GaveUp(f"The model endpoint failed: {exc.message}")
        key = str(commit.number)
        self.tokens[key] = self.tokens.get(key, 0) + usage.total
        if isinstance(outcome, Assigned):  # not offered in a work step
            outcome = GaveUp("The model ended a work step without a commit.")
        if isinstance(outcome, GaveUp):
            self.report.emit("llm_stuck", summary=outcome.summary)
        return outcome

    def _commit(self, commit: CommitSpec, state: WorkState, message: str,
                fix_message: str | None = None) -> CommitSpec:
        tip = self._tip()
        tree = state.tree()
        sha = self.repo.commit_tree(tree, tip, message)
        commit = self._append(commit, CommitCreated(sha))
        self.repo.update_branch(self.spec.cleaned, sha, tip, f"commit #{commit.number}")
        state.committed(tree)
        if fix_message is None:
            self.report.emit("creating_commit", sha=sha, number=commit.number)
        else:
            self.report.emit("fix_done", sha=sha, message=fix_message.splitlines()[0]
                             if fix_message else "")
        return commit

    def _stuck(self, commit: CommitSpec, summary: str) -> CommitSpec:
        commit = self._append(commit, Stuck(summary))
        step = next_step(list(commit.history))
        if isinstance(step, (Extract, Verify)) and step.note:
            self.report.emit("auto_response", text=step.note)
        else:
            self.report.emit("stuck", number=commit.number, summary=summary)
        return commit

    def _append(self, commit: CommitSpec, entry: Entry) -> CommitSpec:
        self.spec, updated = self.specfile.append(commit, entry)
        return updated

    @staticmethod
    def _resolution(stuck: str | None, note: str | None) -> str:
        if not note:
            return ""
        return prompt("resolution", stuck=stuck or "(no summary)", note=note)

    def _commands(self) -> Commands:
        settings = self.spec.sandbox
        return Commands(self.options.build or settings.build, self.options.test or settings.test,
                        self.options.timeout or settings.timeout)

    # -- the end of the run ---------------------------------------------------------------------

    def _finish(self) -> Result:
        self._remainder()
        if self.options.squash_wip:
            self._squash()
        tip = self._tip()
        equal = self.repo.tree_of(tip) == self.repo.tree_of(self.source)
        differing = 0 if equal else len(self.repo.changed_paths(tip, self.source))
        self.report.emit("tree_check", equal=equal, differing=differing)
        self.report.emit(
            "summary", complete=True, logical=len(self.spec.commits),
            fixes=sum(self._fixes(c) for c in self.spec.commits),
            branch=self.spec.cleaned, base=self._first_parent(), tokens=self.tokens)
        return Result(complete=True, trees_equal=equal)

    def _fixes(self, commit: CommitSpec) -> int:
        """How many of this commit's commits are `fixup!`s (a catch-all commit is not)."""
        return sum(1 for sha in commits_created(list(commit.history))
                   if self.repo.message_of(sha).startswith("fixup! "))

    def _first_parent(self) -> str:
        first = commits_created(list(self.spec.commits[0].history))
        parent = self.repo.parent_of(first[0]) if first else None
        return parent or self.base

    def _remainder(self) -> None:
        """What the spec's commits left out: the model assigns each path to the commit it belongs
        to (a `fixup!` of it, verified like any fix); the rest goes into one final commit, loudly.
        Each is recorded in its commit's history after that commit's `complete`."""
        tip = self._tip()
        remaining = self.repo.changed_paths(tip, self.source)
        if not remaining:
            return
        self.report.emit("remainder", paths=remaining)
        with self.backend.open("remainder") as box:
            tree = self.repo.tree_of(tip)
            state = WorkState(self.repo, box, tree, self.source, self._commands())
            box.load_tree(self.repo.tar_of_tree(tree))
            chosen = self._assign(state, remaining) if self.agent else {}
            groups: dict[int, list[str]] = {}
            for path in remaining:
                groups.setdefault(chosen.get(path, 0), []).append(path)
            for number in sorted(n for n in groups if n):
                commit = self.spec.commits[number - 1]
                self._fold(commit, state, groups[number], "remainder_commit",
                           f"fixup! {commit.subject}\n\nRemaining changes from "
                           f"{self.spec.source} that belong to this commit.")
            if groups.get(0):
                sha = self._fold(self.spec.commits[-1], state, groups[0], "leftover_commit",
                                 f"Remaining changes from {self.spec.source}\n\nNo [[commit]] "
                                 f"entry of {self.spec.path.name} claimed these paths:\n"
                                 + "".join(f"  {p}\n" for p in groups[0]))
                self.report.emit("leftover", sha=sha, paths=groups[0])

    def _assign(self, state: WorkState, remaining: list[str]) -> dict[str, int]:
        assert self.agent is not None
        assignments = Assignments(remaining, len(self.spec.commits))
        task = prompt("assign", paths="\n".join(remaining), commits="\n".join(
            f"{c.number}. {c.subject}" for c in self.spec.commits))
        self.report.emit("assigning")
        try:
            outcome, usage = self.agent.run(state, task, "remainder", ASSIGN_TOOLS, assignments)
        except ModelError as exc:
            self.report.emit("warning", message=f"the model could not assign the remaining "
                             f"paths ({exc.message}); they go into one final commit")
            return {}
        self.tokens["remainder"] = self.tokens.get("remainder", 0) + usage.total
        return outcome.paths if isinstance(outcome, Assigned) else dict(assignments.chosen)

    def _fold(self, commit: CommitSpec, state: WorkState, paths: list[str], event: str,
              message: str) -> str:
        """Take `paths` from source as one more commit of `commit`, then verify it (and fix it)
        like any other."""
        self.report.emit(event, number=commit.number, subject=commit.subject, paths=paths)
        self._take_from_source(state, paths)
        commit = self._commit(commit, state, message)
        sha = commits_created(list(commit.history))[-1]
        self._loop(commit, state, resumed=False)
        return sha

    def _squash(self) -> None:
        """Fold each commit's fixups into it: one commit per spec entry, each the tree that
        passed, plus the remainder fixups that belong to it (and to the commits before it). The
        branch moves once, by compare-and-swap, and the final tree is checked."""
        tip = self._tip()
        parent = self._first_parent()
        log = self.repo.log(parent, tip)
        if len(log) == len(self.spec.commits):
            return  # one commit per entry already
        folded: list[FileChange] = []
        trees: list[tuple[str, str]] = []
        for commit in self.spec.commits:
            history = list(commit.history)
            done = history.index(Complete())
            tree = self.repo.tree_of(commits_created(history[:done])[-1])
            for sha in commits_created(history[done:]):  # remainder fixups of this commit
                entries = self.repo.ls_tree(self.repo.tree_of(sha))
                before = self.repo.parent_of(sha) or sha
                folded += [FileChange(p, entries.get(p))
                           for p in self.repo.changed_paths(before, sha)]
            trees.append((self.repo.make_tree(tree, folded), commit.message))
        trees[-1] = (self.repo.tree_of(tip), trees[-1][1])  # nothing after it is lost
        new = parent
        for tree, message in trees:
            new = self.repo.commit_tree(tree, new, message)
        if self.repo.tree_of(new) != self.repo.tree_of(tip):
            raise RetconError("squashing would change the final tree; the branch was not moved")
        self.repo.update_branch(self.spec.cleaned, new, tip, "squash fix commits")
        self.report.emit("squashed", commits=len(trees), tip=new, old_tip=tip)
