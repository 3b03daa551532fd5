"""The loop's give-up rules and the squash check, as tables: pure functions of a history and of
facts about its commits, no I/O."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from retcon_sandbox.spec.history import (
    Budgets,
    CommitCreated,
    Complete,
    Entry,
    GiveUp,
    KeepBranch,
    Made,
    MoveBranch,
    Resolved,
    Response,
    SquashedTree,
    Started,
    Stuck,
    TryFix,
    after_failure,
    passed_commits,
    squash_check,
)


def story(*steps: str) -> tuple[list[Entry], dict[str, Made]]:
    """A history and what git says of its commits, from steps:
    `c` the logical commit, `f` a fix with a new tree, `f=` a fix that returns to its parent's
    tree, `f<N>` a fix that returns to the tree of step N, `r` a remainder fixup (not a fix),
    `gone` a commit the repository does not have, and the entries `stuck`, `resolved`,
    `response` and `complete`."""
    history: list[Entry] = [Started()]
    made: dict[str, Made] = {}
    trees = ["t0"]
    for i, step in enumerate(steps):
        sha = f"{i:040x}"
        entry: Entry
        if step == "stuck":
            entry = Stuck("s")
        elif step == "resolved":
            entry = Resolved("r")
        elif step == "response":
            entry = Response("x")
        elif step == "complete":
            entry = Complete()
        else:
            parent = trees[-1]
            if step == "f=":
                tree = parent
            elif step.startswith("f") and step[1:].isdigit():
                tree = trees[int(step[1:]) + 1]  # the tree after step N
            else:
                tree = f"t{i + 1}"
            entry = CommitCreated(sha)
            if step != "gone":
                made[sha] = Made(tree, parent, fix=step.startswith("f"))
            trees.append(tree)
            history.append(entry)
            continue
        trees.append(trees[-1])
        history.append(entry)
    return history, made


def fixes(n: int) -> list[str]:
    return ["f"] * n


@pytest.mark.parametrize(("steps", "model", "budgets", "expected"), [
    # the first failure of a commit: a first fix
    (["c"], True, Budgets(), TryFix(1)),
    # no model configured: give up at once, whatever the budget
    (["c"], False, Budgets(), "no model is configured"),
    (["c", "f"], False, Budgets(max_fixes=100), "no model is configured"),
    # the fix budget: 10 fixes by default
    (["c", *fixes(9)], True, Budgets(), TryFix(10)),
    (["c", *fixes(10)], True, Budgets(), "Still failing after 10 fix attempts"),
    (["c", "f", "f"], True, Budgets(max_fixes=2), "Still failing after 2 fix attempts"),
    # a restart: the fixes an earlier run recorded still count (nothing lives in memory)
    (["c", "f", "f", "f"], True, Budgets(max_fixes=3), "Still failing after 3 fix attempts"),
    (["response", "c", "f", "response", "f"], True, Budgets(max_fixes=2),
     "Still failing after 2 fix attempts"),
    # a human resolution starts a new attempt with a full budget
    (["c", "f", "f", "stuck", "resolved"], True, Budgets(max_fixes=2), TryFix(1)),
    (["c", "f", "f", "stuck", "resolved", "f"], True, Budgets(max_fixes=2), TryFix(2)),
    (["c", "f", "f", "stuck", "resolved", "f", "f"], True, Budgets(max_fixes=2),
     "Still failing after 2 fix attempts"),
    # the no-progress limit: fixes that leave the tree as it was, or return to an earlier one
    (["c", "f=", "f="], True, Budgets(), TryFix(3)),
    (["c", "f=", "f=", "f="], True, Budgets(), "No progress: 3 fixes"),
    (["c", "f", "f0", "f1", "f0"], True, Budgets(), "No progress: 3 fixes"),
    (["c", "f", "f", "f="], True, Budgets(no_progress=1), "No progress: 1 fixes"),
    (["c", "f=", "f=", "stuck", "resolved", "f="], True, Budgets(no_progress=2), TryFix(2)),
    # the remainder fixup (after `complete`) is not a fix and starts an attempt of its own
    (["c", *fixes(9), "complete", "r"], True, Budgets(), TryFix(1)),
    (["c", *fixes(9), "complete", "r", "f"], True, Budgets(), TryFix(2)),
    (["c", "f", "complete", "r", "f", "f"], True, Budgets(max_fixes=2),
     "Still failing after 2 fix attempts"),
    # commits the repository no longer has are not counted
    (["c", "gone", "gone", "gone"], True, Budgets(max_fixes=2), TryFix(1)),
])
def test_after_failure(steps: Sequence[str], model: bool, budgets: Budgets,
                       expected: TryFix | str) -> None:
    history, made = story(*steps)
    decision = after_failure(history, made, model, budgets, "Tests FAIL (exit 1)")
    if isinstance(expected, TryFix):
        assert decision == expected
    else:
        assert isinstance(decision, GiveUp)
        assert expected in decision.summary
        assert decision.summary.endswith("Tests FAIL (exit 1)")  # the failure goes with it


@pytest.mark.parametrize(("steps", "expected"), [
    (["c", "complete"], [0]),
    (["c", "f", "f", "complete"], [2]),
    (["c", "f", "complete", "r", "complete"], [1, 3]),
    (["c", "f", "complete", "r", "f", "complete", "response"], [1, 4]),
    (["c", "stuck", "resolved", "f"], []),
    (["c", "response", "complete"], [0]),
    ([], []),
])
def test_passed_commits_are_those_a_complete_follows(steps: Sequence[str],
                                                     expected: list[int]) -> None:
    history, _ = story(*steps)
    assert passed_commits(history) == [f"{i:040x}" for i in expected]


OK1 = SquashedTree(1, "refactor", True)
OK2 = SquashedTree(2, "feat", True)
BAD1 = SquashedTree(1, "refactor", False)
BAD3 = SquashedTree(3, "docs", False)


@pytest.mark.parametrize(("final", "trees", "expected"), [
    # the same final tree, and every squashed tree passed: the branch moves
    ("T", [OK1, OK2], MoveBranch()),
    ("T", [], MoveBranch()),
    # a squashed tree fails: the unsquashed branch stays, and a human decides (exit 3)
    ("T", [BAD1, OK2], KeepBranch("squashed commit #1 (refactor) fails the build or tests",
                                  stuck=True, failing=(1,))),
    ("T", [BAD1, OK2, BAD3],
     KeepBranch("squashed commits #1 (refactor), #3 (docs) fail the build or tests", stuck=True,
                failing=(1, 3))),
    # the squash would change the final tree: a bug, checked first, never a stuck commit
    ("U", [OK1, OK2], KeepBranch("squashing would change the final tree", stuck=False)),
    ("U", [BAD1], KeepBranch("squashing would change the final tree", stuck=False)),
])
def test_squash_check(final: str, trees: list[SquashedTree],
                      expected: MoveBranch | KeepBranch) -> None:
    assert squash_check(final, "T", trees) == expected
