"""The ways the draft groups files, each plain and deterministic: cutting the messy branch's
timeline where one piece of work ends, linking files by their pair scores, and folders and
roles for branches too large to score pair by pair."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from retcon_sandbox.plan.evidence import top_folder


def cut(units: Sequence[Sequence[str]], goes_on: Sequence[float], fewest: int, most: int
        ) -> list[list[str]]:
    """`units` in order, joined where `goes_on` (the chance that unit i+1 continues unit i's
    work) is at least 1/2, then cut at the weakest joins (or joined at the strongest cuts)
    until there are between `fewest` and `most` groups."""
    weakest = sorted(range(len(goes_on)), key=lambda i: (goes_on[i], i))
    cuts = {i for i, p in enumerate(goes_on) if p < 0.5}
    if len(cuts) + 1 < fewest:
        cuts = set(weakest[:fewest - 1])
    elif len(cuts) + 1 > most:
        cuts = set(weakest[:max(0, most - 1)])
    groups: list[list[str]] = []
    for i, unit in enumerate(units):
        if i == 0 or i - 1 in cuts:
            groups.append([])
        groups[-1].extend(unit)
    return groups


def link(paths: Sequence[str], score: Callable[[str, str], float], threshold: float,
         fewest: int = 1, most: int | None = None) -> list[list[str]]:
    """Average linkage: merge the two groups whose pairs score highest on average while that
    average is above `threshold` and more than `fewest` groups are left, and in any case while
    more than `most` are. Ties go to the groups met first in `paths`."""
    most = len(paths) if most is None else most
    members: dict[int, list[str]] = {i: [p] for i, p in enumerate(paths)}
    sums: dict[int, dict[int, float]] = {i: {} for i in members}
    heap: list[tuple[float, int, int]] = []
    for i, a in enumerate(paths):
        for j in range(i + 1, len(paths)):
            sums[i][j] = sums[j][i] = value = score(a, paths[j])
            heap.append((-value, i, j))
    heapq.heapify(heap)
    while heap and len(members) > fewest:
        negative, i, j = heapq.heappop(heap)
        if i not in members or j not in members or \
                -negative != sums[i][j] / (len(members[i]) * len(members[j])):
            continue  # stale: one of them was merged since
        if -negative <= threshold and len(members) <= most:
            break
        members[i] += members.pop(j)
        for k, value in sums.pop(j).items():
            if k != i:
                sums[k].pop(j)
                sums[i][k] = sums[k][i] = sums[i].get(k, 0.0) + value
        del sums[i][j]
        for k, total in sums[i].items():
            heapq.heappush(heap, (-total / (len(members[i]) * len(members[k])), min(i, k),
                                  max(i, k)))
    return [members[i] for i in sorted(members)]


def by_folders(paths: Sequence[str], roles: dict[str, str], target: int) -> list[list[str]]:
    """About `target` groups by role and folder: each role's files by top folder, the largest
    split by its next folder level while it holds more than twice its share, then the small
    groups of one role joined."""
    depth = {p: 1 for p in paths}

    def key(p: str) -> tuple[str, str]:
        return roles[p], "/".join(p.split("/")[:-1][:depth[p]])

    while True:
        groups = _by(paths, key)
        largest = max(groups, key=len)
        deeper = [p for p in largest if p.count("/") > depth[p]]
        if len(groups) >= target or len(largest) <= 2 * len(paths) / target or not deeper:
            break
        for p in largest:
            depth[p] += 1
    small = max(2, math.ceil(len(paths) / (4 * target)))
    out = [g for g in groups if len(g) >= small]
    leftovers = _by([p for g in groups if len(g) < small for p in g], lambda p: roles[p])
    return out + leftovers


def by_top_folder(paths: Sequence[str]) -> list[list[str]]:
    """One group per top-level folder (the files at the root: one group), in `paths` order:
    the folders of the pair model's "same top folder"."""
    return _by(paths, top_folder)


def _by(paths: Sequence[str], key: Callable[[str], object]) -> list[list[str]]:
    out: dict[object, list[str]] = {}
    for p in paths:
        out.setdefault(key(p), []).append(p)
    return list(out.values())
