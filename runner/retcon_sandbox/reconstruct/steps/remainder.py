"""The remainder step: what the spec's commits left out. The model assigns each remaining path
to the commit it belongs to (a `fixup!` of it, verified like any fix); the rest goes into one
final commit, loudly. Each is recorded in its commit's history after that commit's `complete`."""

from __future__ import annotations

from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.model.tools import ASSIGN_TOOLS, Assigned, Assignments, StepContext
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.reconstruct.steps.commit import drive
from retcon_sandbox.reconstruct.steps.extract import take_from_source
from retcon_sandbox.resources import prompt
from retcon_sandbox.spec.file import CommitSpec


def remainder(ctx: Run) -> None:
    remaining = ctx.repo.changed_paths(ctx.tip(), ctx.source)
    if not remaining:
        return
    ctx.report.emit("remainder", paths=remaining)
    with ctx.sandbox("remainder") as state:
        chosen = assign(ctx, state, remaining) if ctx.agent else {}
        groups: dict[int, list[str]] = {}
        for path in remaining:
            groups.setdefault(chosen.get(path, 0), []).append(path)
        for number in sorted(n for n in groups if n):
            commit = ctx.commit_spec(number)
            ctx.report.emit("remainder_commit", number=number, subject=commit.subject,
                            paths=groups[number])
            fold(ctx, commit, state, groups[number],
                 f"fixup! {commit.subject}\n\nRemaining changes from {ctx.spec.source} that "
                 "belong to this commit.")
        if groups.get(0):
            last = ctx.spec.commits[-1]
            ctx.report.emit("leftover_commit", number=last.number, paths=groups[0])
            sha = fold(ctx, last, state, groups[0],
                       f"Remaining changes from {ctx.spec.source}\n\nNo [[commit]] entry of "
                       f"{ctx.spec.path.name} claimed these paths:\n"
                       + "".join(f"  {p}\n" for p in groups[0]))
            ctx.report.emit("leftover", number=last.number, sha=sha, paths=groups[0])


def assign(ctx: Run, state: WorkState, remaining: list[str]) -> dict[str, int]:
    assert ctx.agent is not None
    assignments = Assignments(remaining, len(ctx.spec.commits))
    task = prompt("assign", paths="\n".join(remaining), commits="\n".join(
        f"{c.number}. {c.subject}" for c in ctx.spec.commits))
    ctx.report.emit("assigning")
    tool_ctx = StepContext(state, ctx.verifier, assignments)
    outcome, usage = ctx.agent.run(tool_ctx, task, "remainder", ASSIGN_TOOLS)
    ctx.add_tokens("remainder", usage.total)
    chosen = outcome.paths if isinstance(outcome, Assigned) else assignments.chosen
    return dict(chosen)


def fold(ctx: Run, commit: CommitSpec, state: WorkState, paths: list[str], message: str) -> str:
    """Take `paths` from source as one more commit of `commit`, then verify it (and fix it)
    like any other."""
    take_from_source(ctx, state, paths)
    commit, sha = ctx.make_commit(commit, state, message)
    ctx.report.emit("creating_commit", number=commit.number, sha=sha)
    drive(ctx, commit, state)
    return sha
