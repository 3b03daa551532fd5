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


def verify(run: Run, commit: CommitSpec, state: WorkState, step: Verify) -> CommitSpec:
    failure = run.verifier.check(state, commit.number, ahead(run, commit.number))
    if failure is not None:
        explain_failure(run)
    if failure is None:
        if run.options.strict_provenance:
            summary = provenance.gate(run.provenance(commit), True, step.stuck,
                                      provenance_release(commit.history))
            if summary:
                return run.stuck(commit, summary, provenance=True)
        return run.append(commit, Complete())
    decision = after_failure(commit.history, made(run, commit), run.agent is not None,
                             run.options.budgets, failure)
    if isinstance(decision, GiveUp):
        return run.stuck(commit, decision.summary)
    run.report.emit("assessing", number=commit.number)
    run.report.emit("fix_attempt", number=commit.number, attempt=decision.attempt)
    working = state.tree()
    task = prompt("fix", number=commit.number, total=len(run.spec.commits),
                  subject=commit.subject, attempt=decision.attempt, failure=failure,
                  hints=commit.hints or "(none)",
                  diff_lines=run.repo.diff_lines(working, run.source),
                  diffstat=run.repo.diff_stat(working, run.source) or "(empty)",
                  resolution=resolution(step.stuck, step.note))
    outcome = ask_model(run, commit, state, task, f"fix-{decision.attempt}")
    if not isinstance(outcome, Committed):
        summary = outcome.summary if isinstance(outcome, ModelGaveUp) else \
            "The model ended a fix step without a commit."
        return run.stuck(commit, summary)
    if state.tree() in {m.tree for m in made(run, commit).values()}:
        run.report.emit("no_progress", number=commit.number,
                        why="the fix returned to an earlier tree")
    commit, sha = run.make_commit(commit, state,
                                  f"fixup! {fixed_subject(run, commit)}\n\n{outcome.message}")
    run.report.emit("fix_done", number=commit.number, sha=sha,
                    message=outcome.message.splitlines()[0] if outcome.message else "")
    return commit


def fixed_subject(run: Run, commit: CommitSpec) -> str:
    """The subject a fix is a `fixup!` of, so that `git rebase --autosquash` folds it into the
    commit it fixes: the first commit since the last `complete` (the logical commit itself, a
    remainder fixup of it, or the final `Remaining changes` commit), as git has it."""
    first = None
    for entry in commit.history:
        if isinstance(entry, Complete):
            first = None
        elif isinstance(entry, CommitCreated) and first is None:
            first = entry.sha
    if first is None or not run.repo.exists(first):
        return commit.subject
    subject = run.repo.message_of(first).split("\n", 1)[0]
    return subject.removeprefix("fixup! ") or commit.subject


def made(run: Run, commit: CommitSpec) -> dict[str, Made]:
    """What git says of each commit the history records. A commit right after a `complete`
    (a remainder fixup) is not a fix."""
    result = {}
    previous = None
    for entry in commit.history:
        if isinstance(entry, CommitCreated) and run.repo.exists(entry.sha):
            parent = run.repo.parent_of(entry.sha)
            fix = run.repo.message_of(entry.sha).startswith("fixup! ") and \
                not isinstance(previous, Complete)
            result[entry.sha] = Made(run.repo.tree_of(entry.sha),
                                     run.repo.tree_of(parent) if parent else "", fix)
        previous = entry
    return result
