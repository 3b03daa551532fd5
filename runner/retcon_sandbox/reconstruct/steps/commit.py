"""One logical commit, driven by its history: open a sandbox, then act on `next_step` until the
commit is done (or stuck, which stops the run)."""

from __future__ import annotations

from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import GitError, StuckError
from retcon_sandbox.model.tools import Outcome
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.reconstruct.steps.extract import extract
from retcon_sandbox.reconstruct.steps.fixloop import verify
from retcon_sandbox.reconstruct.steps.speculate import opened
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.history import (
    NO_MODEL_PREFIX,
    PROVENANCE_PREFIX,
    Blocked,
    Done,
    Extract,
    Fresh,
    Resolved,
    Started,
    Verify,
    commits_created,
    next_step,
)

ACCEPTED = "accepted on the command line (--accept-provenance)"


def process(run: Run, number: int) -> None:
    commit = run.commit_spec(number)
    step = next_step(commit.history)
    if isinstance(step, Done):
        return
    event = "commit_start" if isinstance(step, Fresh) else "resume"
    run.report.emit(event, number=number, total=len(run.spec.commits), subject=commit.subject)
    if isinstance(step, Blocked):
        commit = unblock(run, commit, step, previously=True)
    if isinstance(step, Verify):
        recover(run, commit, step)
        if step.interrupted:
            run.report.emit("reverifying", number=number, sha=step.expected_tip)
    with opened(run, number) as (state, asked):
        drive(run, commit, state, asked)


def drive(run: Run, commit: CommitSpec, state: WorkState, asked: Outcome | None = None
          ) -> None:
    """`asked`: the model's extraction a kept speculation already did into `state`."""
    made_before = len(commits_created(commit.history))
    while True:
        step = next_step(commit.history)
        if isinstance(step, Done):
            if step.nothing is None:
                created = len(commits_created(commit.history)) > made_before
                run.report.emit("commit_complete", number=commit.number, created=created,
                                fixes=fixes_of(run, commit))
            return
        if isinstance(step, Blocked):
            commit = unblock(run, commit, step)
        elif isinstance(step, Fresh):
            commit = run.append(commit, Started())
        elif isinstance(step, Extract):
            commit, asked = extract(run, commit, state, step, asked), None
        else:
            commit = verify(run, commit, state, step)


def fixes_of(run: Run, commit: CommitSpec) -> int:
    """How many of this commit's commits are `fixup!`s (a catch-all commit is not)."""
    return sum(1 for sha in commits_created(commit.history)
               if run.repo.message_of(sha).startswith("fixup! "))


def recover(run: Run, commit: CommitSpec, step: Verify) -> None:
    """A run stopped after recording a commit: finish a cut-off branch update."""
    tip = run.tip()
    expected = step.expected_tip
    if tip == expected or run.repo.is_ancestor(expected, tip):
        return
    if run.repo.exists(expected) and run.repo.parent_of(expected) == tip:
        if run.repo.clear_interrupted_update(run.spec.cleaned, expected):
            run.report.emit("recovered", number=commit.number,
                            what=f"removed the lock a killed update of {run.spec.cleaned} left")
        run.move_branch(expected, tip, "finish interrupted update")
        run.report.emit("recovered", number=commit.number,
                        what=f"moved {run.spec.cleaned} to {expected[:7]}")
        return
    raise GitError(
        f"commit #{commit.number}'s last recorded commit {expected[:12]} is not on the cleaned "
        f"branch {run.spec.cleaned!r} (tip {tip[:12]})",
        "Reset the branch to that commit, or remove the entries after the last `complete` "
        "from this commit's history, then rerun.")


def unblock(run: Run, commit: CommitSpec, step: Blocked, previously: bool = False
            ) -> CommitSpec:
    accepted = previously and run.options.accept_provenance and \
        step.summary.startswith(PROVENANCE_PREFIX)  # only a stop a human saw before this run
    note = ACCEPTED if accepted else run.ask(commit, step.summary) if run.ask else None
    if note:
        run.report.emit("resolved", number=commit.number, note=note)
        return run.append(commit, Resolved(note))
    if not previously:
        run.report.emit("stopping", number=commit.number)
    raise blocked_error(run.spec.path.name, commit, step.summary, previously, run.spec.cleaned)


def blocked_error(spec_name: str, commit: CommitSpec, summary: str, previously: bool,
                  cleaned: str | None = None) -> StuckError:
    message = f"commit #{commit.number} ({commit.subject}) is stuck: {summary}"
    if previously:
        message = ("Previously stuck - add a `resolved` entry to continue\n"
                   f"  commit #{commit.number} ({commit.subject}): {summary}")
    accept = " (or, once you have checked them, add --accept-provenance)" \
        if summary.startswith(PROVENANCE_PREFIX) else ""
    steps = (f"Edit {spec_name} and add after the `stuck` entry:\n"
             '    { resolved = "description of what you changed" }\n'
             f"then rerun the same command{accept}.")
    if summary.startswith(NO_MODEL_PREFIX):  # a rerun tests the same tree: something must change
        steps = (f"No model will change this commit: fix it yourself with a commit on "
                 f"{cleaned or 'the cleaned branch'} (its `paths` are not taken again once it "
                 "is made), or configure a model (--model, OPENAI_API_KEY) to fix it.\n"
                 + steps)
    return StuckError(message, steps)
