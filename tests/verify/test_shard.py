"""`verify --shard K/N`: the split is a pure function of the range (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from retcon_sandbox.verify.shard import Shard, distinct_trees, parse_shard


@dataclass(frozen=True)
class R:
    sha: str
    tree: str


def rows(trees: str) -> list[R]:
    return [R(f"c{i}", tree) for i, tree in enumerate(trees)]


def test_k_of_n_is_parsed_and_checked() -> None:
    assert parse_shard("2/3") == Shard(2, 3) and parse_shard(" 1/1 ") == Shard(1, 1)
    for bad in ("0/3", "4/3", "1/0", "0/0", "3", "a/b", "-1/3", "1/-3", "2/3/4", "", "1 / 2"):
        with pytest.raises(ValueError, match=r"K/N|K must be"):
            parse_shard(bad)


def test_distinct_trees_go_round_robin_in_range_order() -> None:
    range_ = rows("abcdefg")
    assert [r.tree for r in Shard(1, 3).select(range_)] == ["a", "d", "g"]
    assert [r.tree for r in Shard(2, 3).select(range_)] == ["b", "e"]
    assert [r.tree for r in Shard(3, 3).select(range_)] == ["c", "f"]


def test_a_commit_whose_tree_came_earlier_goes_with_it() -> None:
    range_ = rows("abab c")  # a revert makes tree a again; " " is one more tree
    first = Shard(1, 2).select(range_)
    assert [r.sha for r in first] == ["c0", "c2", "c4"]  # trees a, a, " "
    assert [r.sha for r in Shard(2, 2).select(range_)] == ["c1", "c3", "c5"]  # b, b, c


@pytest.mark.parametrize("n", [1, 2, 3, 5, 11, 12, 20])
def test_n_jobs_cover_each_tree_exactly_once(n: int) -> None:
    range_ = rows("abcdefghijkabc")  # 11 distinct trees, 3 repeated
    seen: list[str] = []
    for k in range(1, n + 1):
        seen += sorted({r.tree for r in Shard(k, n).select(range_)})
    assert sorted(seen) == sorted(set("abcdefghijk"))
    assert sum(len(Shard(k, n).select(range_)) for k in range(1, n + 1)) == len(range_)


def test_the_shard_line() -> None:
    range_ = rows("abcdefghijk")
    mine = Shard(2, 3).select(range_)
    assert Shard(2, 3).line(distinct_trees(mine), distinct_trees(range_)) == \
        "Shard 2/3: 4 of 11 trees"
    assert Shard(12, 12).select(range_) == []
