"""The reconstruction, as a short driver: prepare the cleaned branch, process each logical
commit (steps/commit.py), take care of what no commit took (steps/remainder.py), optionally squash
(steps/squash.py), check that the cleaned tree equals the source tree, and test that tree with
`test_final` when the spec has one (steps/final.py).

Every action appends exactly one entry to the spec, and the next action is derived from the
history again, so a run can stop anywhere and the next run goes on from the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass

from retcon_sandbox.backends.environments import Warming
from retcon_sandbox.errors import EXIT_ERROR, EXIT_OK, EXIT_STUCK, GitError
from retcon_sandbox.reconstruct import ownership
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.reconstruct.steps.commit import fixes_of, process
from retcon_sandbox.reconstruct.steps.final import final_check, tests_summary
from retcon_sandbox.reconstruct.steps.remainder import remainder
from retcon_sandbox.reconstruct.steps.speculate import discard, settle
from retcon_sandbox.reconstruct.steps.squash import first_parent, is_squashed, squash
from retcon_sandbox.repo import checks
from retcon_sandbox.spec.history import Done, Verify, commits_created, next_step
from retcon_sandbox.verify.stages import check_runnable, first_program


@dataclass(frozen=True)
class Result:
    complete: bool
    trees_equal: bool
    final_passed: bool = True  # the finished tree under `test_final` (True when none is set)

    @property
    def exit_code(self) -> int:
        """The run's exit code, decided here once: the summary says `Complete!` only when it
        is 0 (never on an exit 3 or 1)."""
        if not self.trees_equal:
            return EXIT_ERROR
        return EXIT_OK if self.complete and self.final_passed else EXIT_STUCK


def run(ctx: Run) -> Result:
    check_branch(ctx)
    reaped = ctx.backend.reap()  # a killed run's containers, before this one makes its own
    if reaped:
        ctx.report.emit("reaped", count=reaped)
    try:
        preflight(ctx)
        ctx.model_ready()
        prepare_branch(ctx)
        for commit in ctx.spec.commits:
            process(ctx, commit.number)
    finally:  # a stop while the next commit was begun ahead: nothing of it stays
        ctx.drop_handover()
        discard(ctx)
        failed = settle(ctx)
    if failed:
        raise failed[0]
    remainder(ctx)
    if ctx.options.squash_wip:
        squash(ctx)
    return finish(ctx)


def preflight(ctx: Run) -> None:
    """Before the branch is created or any entry written, when there is work left: the
    environment of the tip's tree is prepared (a setup that fails or times out stops here, and
    the first commit reuses it), and the programs the build and test commands start with exist
    in it. So an exit 1 here means that this run recorded nothing (the error's hint says so:
    `Run.what_was_recorded`). Once that check has passed for these commands in this very
    environment (the image's ID, and the prepared environment's), a stamp in the state
    directory says so, and a later run (a redo, a resume) opens no sandbox for it. The base
    commit itself is built and tested only if the first commit fails (steps/basecheck.py)."""
    if all(isinstance(next_step(c.history), Done) for c in ctx.spec.commits):
        return
    if not ctx.settings.setup and not ctx.verifier.runs_anything:
        return
    if ctx.settings.setup:
        ctx.model_ready()  # a model that cannot be used stops the run before setup's minutes
    tip = ctx.repo.branch_sha(ctx.spec.cleaned) or ctx.base
    tree = ctx.repo.tree_of(tip)
    stamp = runnable_stamp(ctx, tree)
    passed = stamp is not None and ctx.state is not None and ctx.state.has_stamp(stamp)
    ctx.report.emit("preflight", sandbox=not passed)  # none: the check passed here before
    if passed:
        return
    stack = contextlib.ExitStack()
    try:
        opened = stack.enter_context(ctx.envs.sandbox("preflight", tree, first_place(ctx, tip)))
        check_runnable(opened.box, ctx.verifier.commands)
        if ctx.final is not None:
            check_runnable(opened.box, ctx.final.commands)
        ctx.model_ready()  # checked meanwhile; before the stamp is written
    except BaseException:
        stack.close()
        raise
    ctx.handover = Warming.ready(tree, opened, stack)  # the first commit's, if it needs it
    stamp = runnable_stamp(ctx, tree)  # its environment is prepared now
    if stamp is not None and ctx.state is not None:
        ctx.state.add_stamp(stamp)


def first_place(ctx: Run, tip: str) -> tuple[str, int]:
    """Where the first commit to work on would open its sandbox on the tip's tree (see
    `Run.place`): the preflight's sandbox sits there, so that commit can take it over."""
    step = next((next_step(c.history) for c in ctx.spec.commits
                 if not isinstance(next_step(c.history), Done)), None)
    return tip, 0 if isinstance(step, Verify) else 1


def runnable_stamp(ctx: Run, tree: str) -> str | None:
    """What the preflight's check depends on: the commands it checks, the environment they run
    in (None when it is not prepared yet), and the tree when a program is a path in it
    (`./run-tests`)."""
    key = ctx.verifier.key_for(tree)
    if key is None:
        return None
    verifiers = [ctx.verifier, *([ctx.final] if ctx.final is not None else [])]
    commands = [v.commands.planned(which) for v in verifiers for which in ("build", "test")]
    programs = [first_program(c) for c in commands if c]
    in_tree = any(p is None or "/" in p for p in programs)
    text = json.dumps({"v": 1, "commands": commands, "environment": key.environment,
                       "tree": tree if in_tree else None})
    return hashlib.sha256(text.encode()).hexdigest()


def check_branch(ctx: Run) -> None:
    """Check the cleaned branch before anything runs or is written: a branch that is not this
    spec's (`ownership.judge`) is adopted only with --adopt-branch, and every commit the
    history records must be on it, in order (`checks.off_chain`)."""
    cleaned = ctx.spec.cleaned
    tip = ctx.repo.branch_sha(cleaned)
    if tip is None:
        no_recorded_commits(ctx)
        return
    if not ctx.repo.is_ancestor(ctx.base, tip):
        raise GitError(
            f"the cleaned branch {cleaned!r} ({tip[:12]}) does not descend from the merge-base "
            f"of {ctx.spec.source} and {ctx.spec.remote} ({ctx.base[:12]})",
            f"Delete it (git branch -D {cleaned}) or name another `cleaned` branch in the spec.")
    chain = ctx.repo.first_parent_chain(ctx.base, tip)
    if chain is None:
        raise GitError(
            f"the cleaned branch {cleaned!r} ({tip[:12]}) does not reach the merge-base "
            f"({ctx.base[:12]}) through first parents",
            f"A reconstruction is a straight line of commits on the merge-base. Delete it (git "
            f"branch -D {cleaned}) or name another `cleaned` branch in the spec.")
    adopt(ctx, tip, chain)
    recorded_on_branch(ctx, tip, chain)


def prepare_branch(ctx: Run) -> None:
    """Create the cleaned branch at the merge-base (checked by `check_branch` first), or go on
    on the existing one."""
    cleaned = ctx.spec.cleaned
    tip = ctx.repo.branch_sha(cleaned)
    if tip is None:
        if ctx.repo.clear_interrupted_update(cleaned, ctx.base):
            ctx.report.emit("warning", message=f"removed the lock a killed creation of "
                            f"{cleaned} left")
        ctx.move_branch(ctx.base, None, ownership.CREATED)
        ctx.report.emit("branch_created", branch=cleaned, base=ctx.base)
        return
    ctx.report.emit("branch_continued", branch=cleaned, tip=tip)


def recorded(ctx: Run) -> list[str]:
    return [sha for c in ctx.spec.commits for sha in commits_created(c.history)]


def no_recorded_commits(ctx: Run) -> None:
    first = next(((c.number, sha) for c in ctx.spec.commits
                  for sha in commits_created(c.history)), None)
    if first is not None:
        raise GitError(
            f"{ctx.spec.path.name}: [[commit]] #{first[0]} → history: commit_created "
            f"{first[1][:12]} is not on {ctx.spec.cleaned}: that branch does not exist",
            "If this spec came from someone else, do not run it here. If you deleted the "
            f"branch, restore it (git branch {ctx.spec.cleaned} <the last recorded commit>) and "
            "rerun with --adopt-branch; to start over, remove the history entries from the "
            "spec.")


def adopt(ctx: Run, tip: str, chain: list[str]) -> None:
    """An existing branch that is not this spec's (`ownership.judge`: who created it, which
    spec's runs put the commits on it) is refused, unless --adopt-branch is given."""
    cleaned = ctx.spec.cleaned
    refusal = ownership.judge(ctx.repo.reflog(cleaned), ctx.spec_id, ctx.spec.path.name,
                              cleaned, ctx.base, chain, recorded(ctx))
    if refusal is None:
        return
    if not ctx.options.adopt_branch:
        raise GitError(f"the cleaned branch {cleaned!r} already exists ({tip[:12]}): "
                       f"{refusal.why}", refusal.hint)
    ctx.report.emit("warning", message=f"--adopt-branch: working on the existing branch "
                    f"{cleaned} ({tip[:12]}), though {refusal.why}")


def recorded_on_branch(ctx: Run, tip: str, chain: list[str]) -> None:
    cleaned = ctx.spec.cleaned
    found = checks.off_chain(ctx.repo, ctx.spec, chain, tip)
    if found is None or is_squashed(ctx, tip, chain):
        return
    raise GitError(
        f"{ctx.spec.path.name}: [[commit]] #{found.number} → history: commit_created "
        f"{found.sha[:12]} is not on {cleaned} ({ctx.base[:12]}..{tip[:12]}, first parents) "
        "where the history puts it",
        "The spec and the branch disagree, so neither says what was built and tested. If the "
        "spec came from someone else, do not run it on this branch. If it is yours, reset the "
        f"branch to the last commit the spec records (git branch -f {cleaned} <sha>), or remove "
        "the history entries of the commits that are not on it, then rerun.")


def finish(ctx: Run) -> Result:
    tip = ctx.tip()
    equal = ctx.repo.tree_of(tip) == ctx.repo.tree_of(ctx.source)
    differing = 0 if equal else len(ctx.repo.changed_paths(tip, ctx.source))
    ctx.report.emit("tree_check", equal=equal, differing=differing)
    check = final_check(ctx, tip) if equal else None
    base = first_parent(ctx)
    nothing = [{"number": c.number, "subject": c.subject, "reason": step.nothing}
               for c in ctx.spec.commits
               if isinstance(step := next_step(c.history), Done) and step.nothing is not None]
    origins = [{"number": c.number, "subject": c.subject, "novel": list(found.novel),
                "foreign": list(found.foreign),
                "invented": [{"path": i.path, "lines": i.lines, "first": i.first, "why": i.why}
                             for i in found.found]}
               for c in ctx.spec.commits if (found := ctx.provenance(c))]
    result = Result(complete=True, trees_equal=equal,
                    final_passed=check is None or check.outcome.passed)
    ctx.report.emit(
        "summary", complete=result.exit_code == EXIT_OK, exit_code=result.exit_code,
        provenance=origins, logical=len(ctx.spec.commits) - len(nothing),
        fixes=sum(fixes_of(ctx, c) for c in ctx.spec.commits),
        squashed=ctx.options.squash_wip, branch=ctx.spec.cleaned, base=base, tip=tip,
        commits=len(ctx.repo.log(base, tip)), nothing=nothing, tokens=ctx.tokens,
        tests=tests_summary(ctx, check))
    return result
