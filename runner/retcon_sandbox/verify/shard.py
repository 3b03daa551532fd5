"""`verify --shard K/N`: the share of a range that job K of N verifies, for a CI matrix.

The split is a pure function of the range: its distinct trees, in range order (oldest first),
go round robin, tree i (from 0) to shard i mod N + 1. So N jobs that see the same range cover
each tree exactly once, whatever order they run in, and a commit whose tree an earlier commit
already has goes with it. Each job records its results as notes; docs/scaling.md says how the
jobs' notes merge.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

_FORM = re.compile(r"([0-9]{1,6})/([0-9]{1,6})")


class HasTree(Protocol):
    @property
    def tree(self) -> str: ...


T = TypeVar("T", bound=HasTree)


@dataclass(frozen=True)
class Shard:
    k: int  # 1-based
    n: int

    def owns(self, index: int) -> bool:
        """Whether the distinct tree at `index` (0-based, in range order) is this shard's."""
        return index % self.n == self.k - 1

    def select(self, rows: Sequence[T]) -> list[T]:
        """The rows whose tree is this shard's, in range order."""
        index: dict[str, int] = {}
        for row in rows:
            index.setdefault(row.tree, len(index))
        return [row for row in rows if self.owns(index[row.tree])]

    def line(self, trees: int, total: int) -> str:
        return f"Shard {self.k}/{self.n}: {trees} of {total} tree{'s' if total != 1 else ''}"


def parse_shard(text: str) -> Shard:
    """`K/N` with 1 <= K <= N; ValueError with what is expected otherwise."""
    match = _FORM.fullmatch(text.strip())
    if not match:
        raise ValueError(f"expected K/N, like 2/3 (job K of N), got {text[:40]!r}")
    k, n = int(match.group(1)), int(match.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"{k}/{n}: K must be from 1 to N (job K of N jobs), N at least 1")
    return Shard(k, n)


def distinct_trees(rows: Sequence[HasTree]) -> int:
    return len({row.tree for row in rows})
