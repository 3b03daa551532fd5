"""`execute --squash-wip` ships only tested trees: a remainder fixup folded into an earlier commit
makes a new tree, which is built and tested before the branch moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from tests.commands.test_execute import assert_every_commit_passes, subjects
from tests.conftest import cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Step, call
from tests.scripts import with_gaps

LOCAL = ("--sandbox", "local", "--non-interactive")
ASSIGN: list[Step] = [[call("assign_path", path="docs/discounts.md", commit=4),
                       call("assign_path", path="tests/test_validation.py", commit=1)],
                      [call("finish_assignment")]]
PYTEST = "python3 -m pytest -q -p no:cacheprovider"
# Fails only for a tree that has the validation tests but not the discounts: the squashed #1
# (commit 1 plus its remainder fixup). No tree the loop builds is like that.
PICKY = PYTEST + " && ! { test -f tests/test_validation.py && test ! -f shop/discounts.py; }"


@pytest.mark.slow
def test_squashed_trees_are_verified_before_the_branch_moves(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(with_gaps(ASSIGN)) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip", "--json", "-j", "2",
                     env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    start = next(e for e in events if e["event"] == "squash_verify")
    checked = [e for e in events if e["event"] == "squash_tree"]
    # #1, #2 and #3 gain tests/test_validation.py; #4 with both fixups is the tip, which passed
    assert start["trees"] == 3 and start["jobs"] == 2
    assert sorted(e["number"] for e in checked) == [1, 2, 3]
    assert all(e["verdict"] == "PASS" and not e["cached"] for e in checked)
    assert [e["event"] for e in events].index("squashed") > events.index(checked[-1])
    assert subjects(demo) == [c[0].splitlines()[0] for c in demo_project.COMMITS]
    squashed = demo.git("rev-list", "--reverse", "main..feature-clean").splitlines()
    trees = {demo.git("rev-parse", f"{sha}^{{tree}}") for sha in squashed}
    assert {e["tree"] for e in checked} <= trees
    assert_every_commit_passes(demo, tmp_path)


@pytest.mark.slow
def test_a_squashed_tree_that_fails_leaves_the_branch_unsquashed(tmp_path: Path) -> None:
    text = demo_project.spec_text(False).replace(f'test = "{PYTEST}"', f"test = '{PICKY}'")
    demo = make_demo(tmp_path / "repo", with_paths=False, spec_text=text)
    with FakeOpenAI(with_gaps(ASSIGN)) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip",
                     env=llm_env(model.base_url))
    assert result.code == 3, result.out + result.err
    assert "#1 refactor: move input validation into shop/validation.py: FAIL (exit 1)" in \
        result.out
    assert "squashed commit #1 (refactor: move input validation into shop/validation.py) " \
        "fails the build or tests" in result.err
    assert "feature-clean was not squashed" in result.err and "without --squash-wip" in result.err
    # the unsquashed branch is in place: every commit as the loop made and verified it
    unsquashed = subjects(demo)
    assert len(unsquashed) == 7 and unsquashed[-2:] == [
        "fixup! refactor: move input validation into shop/validation.py",
        "fixup! docs: document discount codes"]
    assert demo.spec.read_text().count('"complete"') == 6

    # a rerun stops the same way at once: the failure is cached, nothing is built again
    again = cli("execute", str(demo.spec), *LOCAL, "--squash-wip")
    assert again.code == 3, again.out + again.err
    assert "FAIL (exit 1) (cached)" in again.out and "Sandbox ready" not in again.out
    assert subjects(demo) == unsquashed
    # without --squash-wip the (complete, tested) unsquashed branch is the result
    assert cli("execute", str(demo.spec), *LOCAL).code == 0
