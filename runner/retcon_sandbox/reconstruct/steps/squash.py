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
class Planned:
    number: int
    subject: str
    message: str
    tree: str


def first_parent(run: Run) -> str:
    """Where the reconstructed commits start: the merge-base, never a commit the spec names."""
    return run.base


def squashed_trees(run: Run) -> list[Planned]:
    """Each spec entry that made a commit, with its tree once its fixups are folded."""
    folded: list[FileChange] = []
    planned: list[Planned] = []
    for commit in run.spec.commits:
        history = list(commit.history)
        if any(isinstance(e, NothingToExtract) for e in history):
            continue
        done = history.index(Complete())
        tree = run.repo.tree_of(commits_created(history[:done])[-1])
        for sha in commits_created(history[done:]):  # remainder fixups of this commit
            entries = run.repo.ls_tree(run.repo.tree_of(sha))
            before = run.repo.parent_of(sha) or sha
            folded += [FileChange(p, entries.get(p)) for p in run.repo.changed_paths(before, sha)]
        planned.append(Planned(commit.number, commit.subject, commit.message,
                               run.repo.make_tree(tree, folded)))
    return planned


def matches(run: Run, planned: list[Planned], chain: list[str]) -> bool:
    """Whether `chain` (first parents, from the merge-base) is already one commit per entry,
    each with the entry's message and tree."""
    return len(chain) == len(planned) and all(
        run.repo.tree_of(sha) == entry.tree
        and run.repo.message_of(sha).rstrip() == entry.message.rstrip()
        for sha, entry in zip(chain, planned, strict=True))


def is_squashed(run: Run, tip: str, chain: list[str]) -> bool:
    """Whether the branch is what `--squash-wip` made of the recorded commits (which are then
    no longer on it): every entry complete; the recorded commits once a valid branch (in order
    on the first-parent chain of one of them from the merge-base, with the tip's final tree);
    and `chain` one commit per entry with the entry's message and folded tree."""
    if not all(isinstance(next_step(c.history), Done) for c in run.spec.commits):
        return False
    recorded = [sha for c in run.spec.commits for sha in commits_created(c.history)]
    final = run.repo.tree_of(tip)
    if not any(was_branch(run, sha, final) for sha in reversed(recorded)):
        return False
    return matches(run, squashed_trees(run), chain)


def was_branch(run: Run, sha: str, final: str) -> bool:
    if run.repo.tree_of(sha) != final:
        return False
    chain = run.repo.first_parent_chain(run.base, sha)
    return chain is not None and checks.off_chain(run.repo, run.spec, chain, sha) is None


def with_tip(run: Run, planned: list[Planned], tip: str) -> list[Planned]:
    """The last entry takes the tip's tree: nothing after it is lost."""
    last = planned[-1]
    return [*planned[:-1], Planned(last.number, last.subject, last.message,
                                   run.repo.tree_of(tip))]


def squash(run: Run) -> None:
    """Rooted at the merge-base only. Every tree of the squashed branch must have passed in this
    run or in your cache: a `complete` entry in the spec is no proof (the spec may be someone
    else's). A branch that is already one commit per entry is checked the same way."""
    tip = run.tip()
    planned = with_tip(run, squashed_trees(run), tip)
    chain = run.repo.first_parent_chain(run.base, tip)
    already = chain is not None and matches(run, planned, chain)
    new = tip
    if not already:
        new = run.base
        for entry in planned:
            new = run.repo.commit_tree(entry.tree, new, entry.message)
    outcomes = verify_new_trees(run, planned)
    decision = squash_check(run.repo.tree_of(new), run.repo.tree_of(tip), [
        SquashedTree(p.number, p.subject, outcomes[p.tree].passed if p.tree in outcomes else True)
        for p in planned])
    if isinstance(decision, KeepBranch):
        raise refusal(run, decision, planned, outcomes, tip, already)
    if already:
        return
    run.move_branch(new, tip, "squash fix commits")
    run.report.emit("squashed", commits=len(planned), tip=new, old_tip=tip)


def verify_new_trees(run: Run, planned: list[Planned]) -> dict[str, Outcome]:
    """Build and test each squashed tree that this run did not see pass (your cache first)."""
    known = run.verifier.passed_here
    new = [p for p in planned if p.tree not in known]
    if not new or not run.verifier.runs_anything:
        return {}
    run.report.emit("squash_verify", trees=len(new), jobs=run.options.jobs)
    by_tree = {p.tree: p for p in new}

    def finished(item: Item, outcome: Outcome) -> None:
        entry = by_tree[item.tree]
        failed = next((s for s in outcome.stages if not s.passed), None)
        run.report.emit("squash_tree", number=entry.number, subject=entry.subject,
                        verdict=failed.verdict if failed else "PASS", cached=outcome.cached,
                        seconds=outcome.seconds, tree=item.tree)
        if failed is not None:
            run.report.emit("failure_output", number=entry.number, tail=outcome.tail)

    pool = Pool(run.repo, run.envs, run.verifier, run.options.jobs,
                reuse=run.options.reuse, report=run.report)
    return pool.run([Item(p.tree, f"squash-{p.number}", name=f"#{p.number} squashed")
                     for p in new], finished)


def refusal(run: Run, decision: KeepBranch, planned: list[Planned],
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
            f"{decision.summary}: {run.spec.cleaned} ({tip[:12]}) is already one commit per "
            "entry, and not every one of them passes\n  " + "\n  ".join(details),
            "A `complete` entry is no proof that a tree passed; only this run's results and "
            "your own cache are. The branch was not moved: fix the failing commit, or start "
            "again on a new `cleaned` branch.")
    return StuckError(
        f"{decision.summary} once the fixups are folded in; {run.spec.cleaned} was not "
        f"squashed and stays at {tip[:12]}, where every commit passed as it was made\n  "
        + "\n  ".join(details),
        "A remainder fixup folded into an earlier commit makes a tree that was never tested "
        "before. Keep the fixups (rerun without --squash-wip: the branch is complete as it is), "
        "or move the change to the commit it needs in the spec and redo the reconstruction.")
