"""The pipeline's decisions, without I/O: when to begin the next commit ahead, and when what
was begun ahead is what a serial run would do."""

from __future__ import annotations

from retcon_sandbox.pipeline import Pipeline
from retcon_sandbox.reconstruct.steps.speculate import keep, worth
from retcon_sandbox.spec.history import CommitCreated, Response, Started

TREE = "a" * 40
OTHER = "b" * 40


def test_a_speculation_is_kept_when_the_commit_is_untouched_and_the_tree_is_the_tips() -> None:
    assert keep(3, TREE, 3, [], TREE)


def test_a_fix_of_the_previous_commit_discards_it() -> None:
    assert not keep(3, TREE, 3, [], OTHER)  # the tip's tree moved on: a fixup!


def test_another_commit_or_a_recorded_entry_discards_it() -> None:
    assert not keep(3, TREE, 4, [], TREE)
    assert not keep(3, TREE, 3, [Started()], TREE)
    assert not keep(3, TREE, 3, [CommitCreated(OTHER)], TREE)
    # a pre-written response changes what the model is told: not what was asked ahead
    assert not keep(3, TREE, 3, [Response("use the helper")], TREE)


def test_the_next_commit_is_begun_only_when_on_and_untouched() -> None:
    assert worth(Pipeline.FULL, 2, 4, []) and worth(Pipeline.WARM, 2, 4, [])
    assert not worth(Pipeline.OFF, 2, 4, [])  # --no-pipeline
    assert not worth(Pipeline.FULL, 4, 4, None)  # the last commit: nothing follows
    assert not worth(Pipeline.FULL, 2, 4, [Started()])  # a resumed commit runs as serially
