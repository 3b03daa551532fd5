"""`--squash-wip`: fold each commit's fixups into it, leaving one commit per spec entry, each
the tree that passed plus the remainder fixups that belong to it (and to the commits before
it).

Such a folded tree is new: it was never built or tested as it is. Every squashed tree that this
run did not see pass is verified (through your cache, N sandboxes at a time): a `complete` entry
in the spec proves nothing, the spec may be someone else's. The squashed chain is rooted at the
merge-base, and the branch moves, once, by compare-and-swap, only when every tree passes and the
final tree is unchanged (`history.squash_check`). Otherwise the unsquashed branch stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from retcon_sandbox.errors import RetconError, StuckError
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.repo import checks
from retcon_sandbox.repo.gitrepo import FileChange
from retcon_sandbox.spec.history import (
    Complete,
    Done,
    KeepBranch,
    NothingToExtract,
    SquashedTree,
    commits_created,
    next_step,
    squash_check,
)
from retcon_sandbox.verify.cache import Outcome
from retcon_sandbox.verify.pool import Item, Pool


@dataclass(frozen=True)
class PlannedSquash:
    number: int
    subject: str
    message: str
    tree: str


def first_parent(ctx: Run) -> str:
    """Where the reconstructed commits start: the merge-base, never a commit the spec names."""
    return ctx.base


def squashed_trees(ctx: Run) -> list[PlannedSquash]:
    """Each spec entry that made a commit, with its tree once its fixups are folded."""
    folded: list[FileChange] = []
    planned: list[PlannedSquash] = []
    for commit in ctx.spec.commits:
        history = list(commit.history)
        if any(isinstance(e, NothingToExtract) for e in history):
            continue
        done = history.index(Complete())
        tree = ctx.repo.tree_of(commits_created(history[:done])[-1])
        for sha in commits_created(history[done:]):  # remainder fixups of this commit
            entries = ctx.repo.ls_tree(ctx.repo.tree_of(sha))
            before = ctx.repo.parent_of(sha) or sha
            folded += [FileChange(p, entries.get(p)) for p in ctx.repo.changed_paths(before, sha)]
        planned.append(PlannedSquash(commit.number, commit.subject, commit.message,
                               ctx.repo.make_tree(tree, folded)))
    return planned


def matches(ctx: Run, planned: list[PlannedSquash], chain: list[str]) -> bool:
    """Whether `chain` (first parents, from the merge-base) is already one commit per entry,
    each with the entry's message and tree."""
    return len(chain) == len(planned) and all(
        ctx.repo.tree_of(sha) == entry.tree
        and ctx.repo.message_of(sha).rstrip() == entry.message.rstrip()
        for sha, entry in zip(chain, planned, strict=True))


def is_squashed(ctx: Run, tip: str, chain: list[str]) -> bool:
    """Whether the branch is what `--squash-wip` made of the recorded commits (which are then
    no longer on it): every entry complete; the recorded commits once a valid branch (in order
    on the first-parent chain of one of them from the merge-base, with the tip's final tree);
    and `chain` one commit per entry with the entry's message and folded tree."""
    if not all(isinstance(next_step(c.history), Done) for c in ctx.spec.commits):
        return False
    recorded = [sha for c in ctx.spec.commits for sha in commits_created(c.history)]
    final = ctx.repo.tree_of(tip)
    if not any(was_branch(ctx, sha, final) for sha in reversed(recorded)):
        return False
    return matches(ctx, squashed_trees(ctx), chain)


def was_branch(ctx: Run, sha: str, final: str) -> bool:
    if ctx.repo.tree_of(sha) != final:
        return False
    chain = ctx.repo.first_parent_chain(ctx.base, sha)
    return chain is not None and checks.off_chain(ctx.repo, ctx.spec, chain, sha) is None


def with_tip(ctx: Run, planned: list[PlannedSquash], tip: str) -> list[PlannedSquash]:
    """The last entry takes the tip's tree: nothing after it is lost."""
    last = planned[-1]
    return [*planned[:-1], PlannedSquash(last.number, last.subject, last.message,
                                   ctx.repo.tree_of(tip))]


def squash(ctx: Run) -> None:
    """Rooted at the merge-base only. Every tree of the squashed branch must have passed in this
    run or in your cache: a `complete` entry in the spec is no proof (the spec may be someone
    else's). A branch that is already one commit per entry is checked the same way."""
    tip = ctx.tip()
    planned = with_tip(ctx, squashed_trees(ctx), tip)
    chain = ctx.repo.first_parent_chain(ctx.base, tip)
    already = chain is not None and matches(ctx, planned, chain)
    new = tip
    if not already:
        new = ctx.base
        for entry in planned:
            new = ctx.repo.commit_tree(entry.tree, new, entry.message)
    outcomes = verify_new_trees(ctx, planned)
    decision = squash_check(ctx.repo.tree_of(new), ctx.repo.tree_of(tip), [
        SquashedTree(p.number, p.subject, outcomes[p.tree].passed if p.tree in outcomes else True)
        for p in planned])
    if isinstance(decision, KeepBranch):
        raise refusal(ctx, decision, planned, outcomes, tip, already)
    if already:
        return
    ctx.move_branch(new, tip, "squash fix commits")
    ctx.report.emit("squashed", commits=len(planned), tip=new, old_tip=tip)


def verify_new_trees(ctx: Run, planned: list[PlannedSquash]) -> dict[str, Outcome]:
    """Build and test each squashed tree that this run did not see pass (your cache first)."""
    known = ctx.verifier.passed_here
    new = [p for p in planned if p.tree not in known]
    if not new or not ctx.verifier.runs_anything:
        return {}
    ctx.report.emit("squash_verify", trees=len(new), jobs=ctx.options.jobs)
    by_tree = {p.tree: p for p in new}

    def finished(item: Item, outcome: Outcome) -> None:
        entry = by_tree[item.tree]
        failed = next((s for s in outcome.stages if not s.passed), None)
        ctx.report.emit("squash_tree", number=entry.number, subject=entry.subject,
                        verdict=failed.verdict if failed else "PASS", cached=outcome.cached,
                        seconds=outcome.seconds, tree=item.tree)
        if failed is not None:
            ctx.report.emit("failure_output", number=entry.number, tail=outcome.tail)

    pool = Pool(ctx.repo, ctx.envs, ctx.verifier, ctx.options.jobs,
                reuse=ctx.options.reuse, report=ctx.report)
    return pool.run([Item(p.tree, f"squash-{p.number}", name=f"#{p.number} squashed")
                     for p in new], finished)


def refusal(ctx: Run, decision: KeepBranch, planned: list[PlannedSquash],
            outcomes: dict[str, Outcome], tip: str, already: bool = False) -> RetconError:
    if not decision.stuck:
        return RetconError(f"{decision.summary}; the branch was not moved",
                           "This is a bug in retcon-sandbox; the unsquashed branch is intact.")
    details = []
    for entry in planned:
        outcome = outcomes.get(entry.tree)
        if entry.number in decision.failing and outcome and outcome.failure:
            details.append(f"#{entry.number}: " + outcome.failure.splitlines()[0])
    if already:
        return StuckError(
            f"{decision.summary}: {ctx.spec.cleaned} ({tip[:12]}) is already one commit per "
            "entry, and not every one of them passes\n  " + "\n  ".join(details),
            "A `complete` entry is no proof that a tree passed; only this run's results and "
            "your own cache are. The branch was not moved: fix the failing commit, or start "
            "again on a new `cleaned` branch.")
    return StuckError(
        f"{decision.summary} once the fixups are folded in; {ctx.spec.cleaned} was not "
        f"squashed and stays at {tip[:12]}, where every commit passed as it was made\n  "
        + "\n  ".join(details),
        "A remainder fixup folded into an earlier commit makes a tree that was never tested "
        "before. Keep the fixups (rerun without --squash-wip: the branch is complete as it is), "
        "or move the change to the commit it needs in the spec and redo the reconstruction.")
