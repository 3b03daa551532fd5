"""The reconstruction, as a short driver: prepare the cleaned branch, process each logical
commit (steps/commit.py), take care of what no commit took (steps/remainder.py), optionally squash
(steps/squash.py), and check that the cleaned tree equals the source tree.

Every action appends exactly one entry to the spec, and the next action is derived from the
history again, so a run can stop anywhere and the next run goes on from the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from retcon_sandbox.errors import GitError
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.reconstruct.steps.commit import fixes_of, process
from retcon_sandbox.reconstruct.steps.remainder import remainder
from retcon_sandbox.reconstruct.steps.squash import first_parent, squash
from retcon_sandbox.spec.history import Done, next_step


@dataclass(frozen=True)
class Result:
    complete: bool
    trees_equal: bool


def run(ctx: Run) -> Result:
    prepare_branch(ctx)
    reaped = ctx.backend.reap()
    if reaped:
        ctx.report.emit("reaped", count=reaped)
    for commit in ctx.spec.commits:
        process(ctx, commit.number)
    remainder(ctx)
    if ctx.options.squash_wip:
        squash(ctx)
    return finish(ctx)


def prepare_branch(ctx: Run) -> None:
    cleaned = ctx.spec.cleaned
    tip = ctx.repo.branch_sha(cleaned)
    if tip is None:
        if ctx.repo.clear_interrupted_update(cleaned, ctx.base):
            ctx.report.emit("warning", message=f"removed the lock a killed creation of "
                            f"{cleaned} left")
        ctx.repo.update_branch(cleaned, ctx.base, None, "create at merge-base")
        ctx.report.emit("branch_created", branch=cleaned, base=ctx.base)
        return
    if not ctx.repo.is_ancestor(ctx.base, tip):
        raise GitError(
            f"the cleaned branch {cleaned!r} ({tip[:12]}) does not descend from the merge-base "
            f"of {ctx.spec.source} and {ctx.spec.remote} ({ctx.base[:12]})",
            f"Delete it (git branch -D {cleaned}) or name another `cleaned` branch in the spec.")
    ctx.report.emit("branch_continued", branch=cleaned, tip=tip)


def finish(ctx: Run) -> Result:
    tip = ctx.tip()
    equal = ctx.repo.tree_of(tip) == ctx.repo.tree_of(ctx.source)
    differing = 0 if equal else len(ctx.repo.changed_paths(tip, ctx.source))
    ctx.report.emit("tree_check", equal=equal, differing=differing)
    base = first_parent(ctx)
    nothing = [{"number": c.number, "subject": c.subject, "reason": step.nothing}
               for c in ctx.spec.commits
               if isinstance(step := next_step(c.history), Done) and step.nothing is not None]
    origins = [{"number": c.number, "subject": c.subject, "novel": list(found.novel),
                "foreign": list(found.foreign),
                "invented": [{"path": i.path, "lines": i.lines, "first": i.first, "why": i.why}
                             for i in found.found]}
               for c in ctx.spec.commits if (found := ctx.provenance(c))]
    ctx.report.emit(
        "summary", complete=True, provenance=origins, logical=len(ctx.spec.commits) - len(nothing),
        fixes=sum(fixes_of(ctx, c) for c in ctx.spec.commits),
        squashed=ctx.options.squash_wip, branch=ctx.spec.cleaned, base=base, tip=tip,
        commits=len(ctx.repo.log(base, tip)), nothing=nothing, tokens=ctx.tokens)
    return Result(complete=True, trees_equal=equal)
