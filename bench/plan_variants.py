"""Ideas for the draft that were measured on the benchmark and dropped, kept runnable: each is
put in place of part of the draft, the weights are fitted again (bench/plan_fit.py), and the
mean ARI per messy mode is printed with weights fitted on all projects and with weights fitted
without the range's own project (what a project the weights have not seen can expect), beside
the draft as it is.

    python3 bench/plan_variants.py [--mirrors DIR] [--cache FILE] [--variant NAME ...]

The variants:
- `segments`: the timeline cut by dynamic programming, for the most likely segmentation (the
  log-odds of the pairs each segment holds, plus those of the joins it keeps), not join by join;
- `expected cuts`: the timeline cut at its weakest joins, as many as the joins' chances of
  not going on add up to, rather than at each join below an even chance;
- `moves`: after linking by structure, each file moved to the group where its pairs' log-odds
  sum highest (a local search on the likelihood that the draft compares folders by), starting
  from the linkage and from the top-level folders;
- `folders first`: linking by structure with the pairs of two top-level folders lowered by 3,
  so that groups form within folders first;
- `history`: two more pair features from the project's own history before the branch (the
  last 1,000 commits of 30 files or fewer): how often the two files changed together, against
  the rarer of them, and whether both have a history.
Each stays a figure to read: none is in the draft (see docs/plan.md).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import plan_fit  # bench/plan_fit.py: its fits, and the draft's evidence memoised
from plan_fit import Example
from realhistory import MODES, find_mirror, load_ranges, mirror_roots

from retcon_sandbox.plan import cluster, evidence, weights
from retcon_sandbox.plan import draft as drafting
from retcon_sandbox.plan.evidence import Structure, top_folder

Score = Callable[[str, str], float]
HISTORY = 1000  # commits of the project's history read, newest first
SWEEP = 30  # a commit of more files says little of which belong together
PENALTY = 3.0  # `folders first`: log-odds taken from a pair of two top-level folders


@contextlib.contextmanager
def patched(*changes: tuple[Any, str, Any]) -> Iterator[None]:
    """Attributes set for the duration, then put back."""
    saved = [(target, name, getattr(target, name)) for target, name, _ in changes]
    for target, name, value in changes:
        setattr(target, name, value)
    try:
        yield
    finally:
        for target, name, value in saved:
            setattr(target, name, value)


def evaluate(data: Sequence[Example]) -> dict[str, tuple[float, float]]:
    """Mode -> mean ARI with weights fitted on all, and fitted without the range's project."""
    held = plan_fit.held_out(data)
    plan_fit.fit_all(data)
    return {mode: (mean(plan_fit.ari(ex) for ex in data if ex.mode == mode),
                   mean(held[(ex.name, mode)] for ex in data if ex.mode == mode))
            for mode in MODES}


# --- segments ------------------------------------------------------------------------------------


def segments(units: Sequence[Sequence[str]], goes_on: Sequence[float], fewest: int, most: int,
             score: Score) -> list[list[str]]:
    """The segmentation of `units` (between `fewest` and `most` segments) with the highest sum
    of the log-odds of the pairs within segments and of the joins kept."""
    n = len(units)
    joins = [math.log(max(p, 1e-9) / max(1 - p, 1e-9)) for p in goes_on]
    inside: dict[tuple[int, int], float] = {}
    for i in range(n):
        total, files = 0.0, list[str]()
        for j in range(i, n):
            total += sum(score(a, b) for a in units[j] for b in files)
            total += sum(score(a, b) for k, a in enumerate(units[j]) for b in units[j][:k])
            total += joins[j - 1] if j > i else 0.0
            files += units[j]
            inside[i, j + 1] = total
    most = min(most, n)
    best: list[dict[int, tuple[float, int]]] = [{0: (0.0, -1)}]
    for k in range(1, most + 1):
        best.append({j: max((best[k - 1][i][0] + inside[i, j], i) for i in best[k - 1] if i < j)
                     for j in range(k, n + 1)})
    k = max(range(min(fewest, most), most + 1), key=lambda k: best[k][n][0])
    bounds, j = [], n
    while k > 0:
        i = best[k][j][1]
        bounds.append((i, j))
        j, k = i, k - 1
    return [[p for u in units[i:j] for p in u] for i, j in reversed(bounds)]


def with_segments(ex: Example) -> Any:
    scores = drafting.Scores(plan_fit._structure(ex.facts), ex.facts.paths)

    def cut(units: Sequence[Sequence[str]], goes_on: Sequence[float], fewest: int, most: int
            ) -> list[list[str]]:
        return segments(units, goes_on, fewest, most, scores)
    return patched((drafting, "cut", cut))


def expected_cut(units: Sequence[Sequence[str]], goes_on: Sequence[float], fewest: int,
                 most: int) -> list[list[str]]:
    """The weakest joins cut, as many as the joins' chances of not going on add up to: their
    chances moved below 1/2 and the others' above, in the same order, for the draft's cut."""
    count = round(sum(1 - p for p in goes_on))
    weakest = set(sorted(range(len(goes_on)), key=lambda i: (goes_on[i], i))[:count])
    chances = [0.49 * p if i in weakest else 0.51 + 0.49 * p for i, p in enumerate(goes_on)]
    return cluster.cut(units, chances, fewest, most)


# --- moves and folders first ---------------------------------------------------------------------


def moved(paths: Sequence[str], score: Score, groups: Sequence[Sequence[str]], fewest: int
          ) -> list[list[str]]:
    """Each file to the group where its pairs' log-odds sum highest, until none moves."""
    out = [list(g) for g in groups]
    home = {p: i for i, g in enumerate(out) for p in g}
    for _ in range(10):
        changed = False
        for p in paths:
            sums: dict[int, float] = {}
            for q in paths:
                if q != p:
                    sums[home[q]] = sums.get(home[q], 0.0) + score(p, q)
            here = home[p]
            to = max(sums, key=lambda g: (sums[g], g == here))
            left = sum(1 for g in out if g)
            if to != here and sums[to] > sums.get(here, 0.0) and \
                    (len(out[here]) > 1 or left > fewest):
                out[here].remove(p)
                out[to].append(p)
                home[p], changed = to, True
        if not changed:
            break
    return [g for g in out if g]


def with_moves(ex: Example) -> Any:
    original = cluster.link  # what the draft links with

    def link(paths: Sequence[str], score: Score, threshold: float, fewest: int = 1,
             most: int | None = None) -> list[list[str]]:
        starts = [original(paths, score, threshold, fewest, most), cluster.by_top_folder(paths)]
        found = [moved(paths, score, g, fewest) for g in starts
                 if fewest <= len(g) <= (most or len(paths))]
        return max(found, key=lambda g: sum(score(a, b) for group in g
                                            for i, a in enumerate(group) for b in group[i + 1:]))
    return patched((drafting, "link", link))


def with_folders_first(ex: Example) -> Any:
    original = cluster.link  # what the draft links with

    def link(paths: Sequence[str], score: Score, threshold: float, fewest: int = 1,
             most: int | None = None) -> list[list[str]]:
        def lowered(a: str, b: str) -> float:
            return score(a, b) - (PENALTY if top_folder(a) != top_folder(b) else 0.0)
        return original(paths, lowered, threshold, fewest, most)
    return patched((drafting, "link", link))


# --- history -------------------------------------------------------------------------------------


def co_changes(gitdir: Path, base: str, paths: Sequence[str]) -> tuple[Counter[str],
                                                                        Counter[tuple[str, str]]]:
    """How often each changed file, and each pair, changed in the history before `base`."""
    log = subprocess.run(["git", f"--git-dir={gitdir}", "log", "--no-merges", "-n",
                          str(HISTORY), "--name-only", "--format=%x00", base],
                         capture_output=True, text=True, check=True).stdout
    wanted = set(paths)
    alone: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    for block in log.split("\0")[1:]:
        files = block.split()
        if 0 < len(files) <= SWEEP:
            kept = sorted(wanted.intersection(files))
            alone.update(kept)
            pairs.update((a, b) for i, a in enumerate(kept) for b in kept[i + 1:])
    return alone, pairs


def with_history(data: Sequence[Example], mirrors: str | None) -> Any:
    ranges = {r.name: r for r in load_ranges()}
    roots = mirror_roots(mirrors)
    known = {id(plan_fit._structure(ex.facts)): co_changes(
        find_mirror(ranges[ex.name].repo, roots), ranges[ex.name].base, ex.facts.paths)
        for ex in data}
    names = (*evidence.FEATURES, "history together", "history known")
    plain = plan_fit._pair

    def pair(s: Structure, a: str, b: str) -> tuple[float, ...]:
        alone, pairs = known[id(s)]
        least = min(alone[a], alone[b])
        together = pairs[(a, b) if a < b else (b, a)] / least if least else 0.0
        return (*plain(s, a, b), together, float(least > 0))
    return patched((drafting, "FEATURES", names), (plan_fit, "FEATURES", names),
                   (drafting, "features", pair), (plan_fit, "_pair", pair))


# --- output --------------------------------------------------------------------------------------

VARIANTS = ("segments", "expected cuts", "moves", "folders first", "history")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors")
    parser.add_argument("--cache", help="keep the branches' facts in this file between runs")
    parser.add_argument("--variant", choices=VARIANTS, action="append")
    args = parser.parse_args()
    data = plan_fit.load(args.mirrors, args.cache)
    kept = (weights.PAIR, weights.GOES_ON, weights.LINK)
    print("| variant | " + " | ".join(f"{m} ARI, fitted on all | {m}, without the project"
                                      for m in MODES) + " |")
    print("|---|" + "---:|---:|" * len(MODES))
    for name in ("the draft", *(args.variant or VARIANTS)):
        if name == "history":
            context = with_history(data, args.mirrors)
        elif name == "the draft":
            context = contextlib.nullcontext()
        elif name == "expected cuts":
            context = patched((drafting, "cut", expected_cut))
        else:
            maker = {"segments": with_segments, "moves": with_moves,
                     "folders first": with_folders_first}[name]
            context = _per_example(maker)
        with context:
            figures = evaluate(data)
        weights.PAIR, weights.GOES_ON, weights.LINK = kept
        print(f"| {name} | " + " | ".join(f"{figures[m][0]:.3f} | {figures[m][1]:.3f}"
                                          for m in MODES) + " |", flush=True)


@contextlib.contextmanager
def _per_example(maker: Callable[[Example], Any]) -> Iterator[None]:
    """`maker`'s patch in place while the draft reads each branch: plan_fit.ari drafts one
    branch at a time, so the patch follows the branch it is asked for."""
    original = plan_fit.ari

    def ari(ex: Example) -> float:
        with maker(ex):
            return original(ex)
    with patched((plan_fit, "ari", ari)):
        yield


if __name__ == "__main__":
    main()
