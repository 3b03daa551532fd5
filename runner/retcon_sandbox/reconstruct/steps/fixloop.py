"""The fix loop: verify the newest commit of a logical commit; on failure, decide (purely, from
the history, see `history.after_failure`) whether to ask the model for a `fixup!` or give up."""

from __future__ import annotations

from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.model.tools import Committed
from retcon_sandbox.model.tools import GaveUp as ModelGaveUp
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.reconstruct.steps.ask import ask_model, resolution
from retcon_sandbox.reconstruct.steps.basecheck import explain_failure
from retcon_sandbox.reconstruct.steps.speculate import ahead
from retcon_sandbox.repo import provenance
from retcon_sandbox.resources import prompt
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.history import (
    CommitCreated,
    Complete,
    GiveUp,
    Made,
    Verify,
    after_failure,
    provenance_release,
)


def verify(ctx: Run, commit: CommitSpec, state: WorkState, step: Verify) -> CommitSpec:
    failure = ctx.verifier.check(state, commit.number, ahead(ctx, commit.number))
    if failure is not None:
        explain_failure(ctx)
    if failure is None:
        if ctx.options.strict_provenance:
            summary = provenance.gate(ctx.provenance(commit), True, step.stuck,
                                      provenance_release(commit.history))
            if summary:
                return ctx.stuck(commit, summary, provenance=True)
        return ctx.append(commit, Complete())
    decision = after_failure(commit.history, made(ctx, commit), ctx.agent is not None,
                             ctx.options.budgets, failure)
    if isinstance(decision, GiveUp):
        return ctx.stuck(commit, decision.summary)
    ctx.report.emit("assessing", number=commit.number)
    ctx.report.emit("fix_attempt", number=commit.number, attempt=decision.attempt)
    working = state.tree()
    task = prompt("fix", number=commit.number, total=len(ctx.spec.commits),
                  subject=commit.subject, attempt=decision.attempt, failure=failure,
                  hints=commit.hints or "(none)",
                  diff_lines=ctx.repo.diff_lines(working, ctx.source),
                  diffstat=ctx.repo.diff_stat(working, ctx.source) or "(empty)",
                  resolution=resolution(step.stuck, step.note))
    outcome = ask_model(ctx, commit, state, task, f"fix-{decision.attempt}")
    if not isinstance(outcome, Committed):
        summary = outcome.summary if isinstance(outcome, ModelGaveUp) else \
            "The model ended a fix step without a commit."
        return ctx.stuck(commit, summary)
    if state.tree() in {m.tree for m in made(ctx, commit).values()}:
        ctx.report.emit("no_progress", number=commit.number,
                        why="the fix returned to an earlier tree")
    commit, sha = ctx.make_commit(commit, state,
                                  f"fixup! {fixed_subject(ctx, commit)}\n\n{outcome.message}")
    ctx.report.emit("fix_done", number=commit.number, sha=sha,
                    message=outcome.message.splitlines()[0] if outcome.message else "")
    return commit


def fixed_subject(ctx: Run, commit: CommitSpec) -> str:
    """The subject a fix is a `fixup!` of, so that `git rebase --autosquash` folds it into the
    commit it fixes: the first commit since the last `complete` (the logical commit itself, a
    remainder fixup of it, or the final `Remaining changes` commit), as git has it."""
    first = None
    for entry in commit.history:
        if isinstance(entry, Complete):
            first = None
        elif isinstance(entry, CommitCreated) and first is None:
            first = entry.sha
    if first is None or not ctx.repo.exists(first):
        return commit.subject
    subject = ctx.repo.message_of(first).split("\n", 1)[0]
    return subject.removeprefix("fixup! ") or commit.subject


def made(ctx: Run, commit: CommitSpec) -> dict[str, Made]:
    """What git says of each commit the history records. A commit right after a `complete`
    (a remainder fixup) is not a fix."""
    result = {}
    previous = None
    for entry in commit.history:
        if isinstance(entry, CommitCreated) and ctx.repo.exists(entry.sha):
            parent = ctx.repo.parent_of(entry.sha)
            fix = ctx.repo.message_of(entry.sha).startswith("fixup! ") and \
                not isinstance(previous, Complete)
            result[entry.sha] = Made(ctx.repo.tree_of(entry.sha),
                                     ctx.repo.tree_of(parent) if parent else "", fix)
        previous = entry
    return result
