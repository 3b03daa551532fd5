"""How far a plan is from a gold plan: pairwise precision and recall (of pairs of files put in
one commit) and the adjusted Rand index, over the files both place."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    ari: float
    groups: int
    gold_groups: int


def labels(groups: Sequence[Sequence[str]]) -> dict[str, int]:
    return {p: i for i, g in enumerate(groups) for p in g}


def score(plan: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> Score:
    a, b = labels(plan), labels(gold)
    files = sorted(set(a) & set(b))
    both = Counter((a[p], b[p]) for p in files)
    left = Counter(a[p] for p in files)
    right = Counter(b[p] for p in files)
    together = sum(comb(n, 2) for n in both.values())
    planned = sum(comb(n, 2) for n in left.values())
    golden = sum(comb(n, 2) for n in right.values())
    total = comb(len(files), 2)
    expected = planned * golden / total if total else 0.0
    top = (planned + golden) / 2
    ari = 1.0 if top == expected else (together - expected) / (top - expected)
    return Score(together / planned if planned else 1.0, together / golden if golden else 1.0,
                 ari, len(plan), len(gold))


def per_directory(paths: Sequence[str]) -> list[list[str]]:
    """The naive baseline: one commit per directory."""
    out: dict[str, list[str]] = {}
    for p in paths:
        out.setdefault(p.rsplit("/", 1)[0] if "/" in p else ".", []).append(p)
    return list(out.values())


def per_messy_commit(paths: Sequence[str], touched: Mapping[str, int]) -> list[list[str]]:
    """The other naive baseline: each file in the last messy commit that touched it."""
    out: dict[int, list[str]] = {}
    for p in paths:
        out.setdefault(touched.get(p, -1), []).append(p)
    return [out[k] for k in sorted(out)]
