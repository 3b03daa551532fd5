"""Extraction: moving one logical commit's changes from the source branch into the working
state, by plain code for `paths` commits, or by the model from the hints."""

from __future__ import annotations

from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.model.tools import EXTRACT_TOOLS, Committed, GaveUp, NothingLeft, ToolOutcome
from retcon_sandbox.paths import Patterns
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.reconstruct.steps.ask import ask_model, resolution
from retcon_sandbox.resources import prompt
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.history import Extract, NothingToExtract
from retcon_sandbox.spec.owed import Owed, still_owed


def extract(ctx: Run, commit: CommitSpec, state: WorkState, step: Extract,
            asked: ToolOutcome | None = None) -> CommitSpec:
    """`asked`: the model's answer, already given to a speculation that is kept (see
    steps/speculate.py)."""
    if step.note:
        ctx.report.emit("resolved", number=commit.number, note=step.note)
    if commit.paths is not None:
        diff_event(ctx, commit, state.tree())
        return take_paths(ctx, commit, state)
    outcome = asked if asked is not None else ask_extraction(ctx, commit, state, step)
    if isinstance(outcome, GaveUp):
        return ctx.stuck(commit, outcome.summary)
    if isinstance(outcome, NothingLeft):
        return nothing_left(ctx, commit, outcome.reason)
    assert isinstance(outcome, Committed)
    commit, sha = ctx.make_commit(commit, state, commit.message)
    ctx.report.emit("creating_commit", number=commit.number, sha=sha)
    return commit


def diff_event(ctx: Run, commit: CommitSpec, working: str) -> int:
    diff_lines = ctx.repo.diff_lines(working, ctx.source)
    ctx.report.emit("diff", number=commit.number, lines=diff_lines)
    return diff_lines


def ask_extraction(ctx: Run, commit: CommitSpec, state: WorkState, step: Extract,
                   label: str = "extract", tokens: str | None = None) -> ToolOutcome:
    """The model's extraction into `state`; writes nothing to the spec or the branch."""
    working = state.tree()
    diff_lines = diff_event(ctx, commit, working)
    ctx.report.emit("extracting", number=commit.number)
    task = prompt("extract", number=commit.number, total=len(ctx.spec.commits),
                  message=commit.message, hints=commit.hints or "(none)", diff_lines=diff_lines,
                  diffstat=ctx.repo.diff_stat(working, ctx.source) or "(empty)",
                  resolution=resolution(step.stuck, step.note))
    return ask_model(ctx, commit, state, task, label, EXTRACT_TOOLS,
                     owed=lambda held_by: owed(ctx, commit, state, held_by), tokens=tokens)


def owed(ctx: Run, commit: CommitSpec, state: WorkState, held_by: int | None) -> Owed | None:
    """What this commit still owes, were it to end without a commit now (see spec/owed.py): the
    model may not say "nothing to extract" while it owes something, or the commit would vanish
    from the history."""
    changed = ctx.repo.changed_paths(state.tree(), ctx.source)
    return still_owed(commit, ctx.spec.commits, changed, held_by)


def take_paths(ctx: Run, commit: CommitSpec, state: WorkState) -> CommitSpec:
    assert commit.paths is not None
    patterns = Patterns(commit.paths)
    versioned = dict(commit.versions)
    changed = [p for p in ctx.repo.changed_paths(state.tree(), ctx.source)
               if patterns.matches(p) and p not in versioned]
    versions = ctx.versions(commit, state.tree())
    if not changed and not versions:
        return nothing_left(ctx, commit, "none of its paths (" + ", ".join(commit.paths) +
                            ") differ from the source branch any more")
    ctx.report.emit("taking_paths", number=commit.number, paths=[*changed, *versions])
    take_from_source(ctx, state, changed)
    for path, entry in versions.items():  # as a commit of the source branch had it
        state.put(path, entry)
    commit, sha = ctx.make_commit(commit, state, commit.message)
    ctx.report.emit("creating_commit", number=commit.number, sha=sha)
    return commit


def take_from_source(ctx: Run, state: WorkState, paths: list[str]) -> None:
    """Set `paths` to their state on the source branch, from its own objects."""
    entries = ctx.source_entries()
    for path in paths:
        state.put(path, entries.get(path))


def nothing_left(ctx: Run, commit: CommitSpec, reason: str) -> CommitSpec:
    ctx.report.emit("nothing_to_extract", number=commit.number, subject=commit.subject,
                    reason=reason)
    return ctx.append(commit, NothingToExtract(reason))
