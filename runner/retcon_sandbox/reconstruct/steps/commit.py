"""One logical commit, driven by its history: open a sandbox, then act on `next_step` until the
commit is done (or stuck, which stops the run)."""

from __future__ import annotations

from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import GitError, StuckError
from retcon_sandbox.model.tools import ToolOutcome
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


def process(ctx: Run, number: int) -> None:
    commit = ctx.commit_spec(number)
    step = next_step(commit.history)
    if isinstance(step, Done):
        return
    event = "commit_start" if isinstance(step, Fresh) else "resume"
    ctx.report.emit(event, number=number, total=len(ctx.spec.commits), subject=commit.subject)
    if isinstance(step, Blocked):
        commit = unblock(ctx, commit, step, previously=True)
    if isinstance(step, Verify):
        recover(ctx, commit, step)
        if step.interrupted:
            ctx.report.emit("reverifying", number=number, sha=step.expected_tip)
    with opened(ctx, number) as (state, asked):
        drive(ctx, commit, state, asked)


def drive(ctx: Run, commit: CommitSpec, state: WorkState, asked: ToolOutcome | None = None
          ) -> None:
    """`asked`: the model's extraction a kept speculation already did into `state`."""
    made_before = len(commits_created(commit.history))
    while True:
        step = next_step(commit.history)
        if isinstance(step, Done):
            if step.nothing is None:
                created = len(commits_created(commit.history)) > made_before
                ctx.report.emit("commit_complete", number=commit.number, created=created,
                                fixes=fixes_of(ctx, commit))
            return
        if isinstance(step, Blocked):
            commit = unblock(ctx, commit, step)
        elif isinstance(step, Fresh):
            commit = ctx.append(commit, Started())
        elif isinstance(step, Extract):
            commit, asked = extract(ctx, commit, state, step, asked), None
        else:
            commit = verify(ctx, commit, state, step)


def fixes_of(ctx: Run, commit: CommitSpec) -> int:
    """How many of this commit's commits are `fixup!`s (a catch-all commit is not)."""
    return sum(1 for sha in commits_created(commit.history)
               if ctx.repo.message_of(sha).startswith("fixup! "))


def recover(ctx: Run, commit: CommitSpec, step: Verify) -> None:
    """A run stopped after recording a commit: finish a cut-off branch update."""
    tip = ctx.tip()
    expected = step.expected_tip
    if tip == expected or ctx.repo.is_ancestor(expected, tip):
        return
    if ctx.repo.exists(expected) and ctx.repo.parent_of(expected) == tip:
        if ctx.repo.clear_interrupted_update(ctx.spec.cleaned, expected):
            ctx.report.emit("recovered", number=commit.number,
                            what=f"removed the lock a killed update of {ctx.spec.cleaned} left")
        ctx.move_branch(expected, tip, "finish interrupted update")
        ctx.report.emit("recovered", number=commit.number,
                        what=f"moved {ctx.spec.cleaned} to {expected[:7]}")
        return
    raise GitError(
        f"commit #{commit.number}'s last recorded commit {expected[:12]} is not on the cleaned "
        f"branch {ctx.spec.cleaned!r} (tip {tip[:12]})",
        "Reset the branch to that commit, or remove the entries after the last `complete` "
        "from this commit's history, then rerun.")


def unblock(ctx: Run, commit: CommitSpec, step: Blocked, previously: bool = False
            ) -> CommitSpec:
    accepted = previously and ctx.options.accept_provenance and \
        step.summary.startswith(PROVENANCE_PREFIX)  # only a stop a human saw before this run
    note = ACCEPTED if accepted else ctx.ask(commit, step.summary) if ctx.ask else None
    if note:
        ctx.report.emit("resolved", number=commit.number, note=note)
        return ctx.append(commit, Resolved(note))
    if not previously:
        ctx.report.emit("stopping", number=commit.number)
    raise blocked_error(ctx.spec.path.name, commit, step.summary, previously, ctx.spec.cleaned)


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
