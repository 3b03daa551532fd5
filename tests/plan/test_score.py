"""The distance between a plan and a gold plan."""

from __future__ import annotations

import pytest

from retcon_sandbox.plan.score import per_directory, per_messy_commit, score


def test_identical_plans_score_one_whatever_the_order() -> None:
    s = score([["a", "b"], ["c"]], [["c"], ["b", "a"]])
    assert (s.precision, s.recall, s.ari) == (1.0, 1.0, 1.0)


def test_one_big_group_has_full_recall_and_low_precision() -> None:
    s = score([["a", "b", "c", "d"]], [["a", "b"], ["c", "d"]])
    assert s.recall == 1.0 and s.precision == pytest.approx(2 / 6) and s.ari == 0.0


def test_splitting_loses_recall_only() -> None:
    s = score([["a"], ["b"], ["c", "d"]], [["a", "b"], ["c", "d"]])
    assert s.precision == 1.0 and s.recall == 0.5 and 0 < s.ari < 1


def test_baselines() -> None:
    assert per_directory(["a/x", "a/y", "b/z", "top"]) == [["a/x", "a/y"], ["b/z"], ["top"]]
    assert per_messy_commit(["x", "y", "z"], {"x": 3, "y": 1, "z": 3}) == [["y"], ["x", "z"]]
