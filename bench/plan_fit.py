"""Fit the draft's weights (runner/retcon_sandbox/plan/weights.py) on the real histories of
bench/plan_ranges.toml, and show how they carry to a project they were not fitted on.

    python3 bench/plan_fit.py [--mirrors DIR] [--write]

Three fits, each a logistic regression (Newton's method, an L2 penalty of 1/2 per weight, each
messy branch weighing the same):
1. a pair of files: one commit in the gold plan or not, from plan/evidence.py's features;
2. a unit of the timeline and the next: one gold commit or not (branches whose history the
   draft reads as ordered), from draft.goes_on_features;
3. the linkage threshold, the one of a few values with the best mean ARI on the branches the
   draft links by structure.
Then leave-one-project-out: each project's branches drafted with weights fitted on the other
projects only, beside the weights fitted on all. `--write` rewrites weights.py.
Deterministic: the same ranges give the same weights.
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realhistory import (
    MODES,
    build,
    find_mirror,
    gold,
    load_ranges,
    messify,
    mirror_roots,
    real_steps,
)

from retcon_sandbox.commands.plan import choose, read_facts
from retcon_sandbox.plan import draft as drafting
from retcon_sandbox.plan import weights
from retcon_sandbox.plan.evidence import (
    FEATURES,
    Structure,
    features,
    structure,
    timeline,
)
from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.score import score
from retcon_sandbox.repo.gitrepo import Repo

GOES_ON = ("mean score", "best score", "window score", "next says nothing",
           "this says nothing", "gap", "this size", "next size", "granularity")
THRESHOLDS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)
Row = tuple[float, ...]


@dataclass(frozen=True)
class Example:
    project: str
    name: str
    mode: str
    facts: Facts
    gold: list[list[str]]


def examples(mirrors: str | None) -> Iterator[Example]:
    roots = mirror_roots(mirrors)
    with tempfile.TemporaryDirectory(prefix="retcon-bench-fit-") as tmp:
        for r in load_ranges():
            mirror = find_mirror(r.repo, roots)
            for mode in MODES:
                directory = build(Path(tmp) / f"{r.name.replace('/', '+')}-{mode}", mirror, r,
                                  messify(mirror, r, mode))
                facts = read_facts(choose(Repo(directory), "feature", "main", None))
                yield Example(r.repo, r.name, mode, facts, gold(real_steps(mirror, r),
                                                                facts.paths))


# --- the evidence of each branch, read once (the folds refit weights, not evidence) -------------

_structures: dict[int, Structure] = {}
_features: dict[tuple[int, str, str], tuple[float, ...]] = {}


def _structure(facts: Facts) -> Structure:
    if id(facts) not in _structures:
        _structures[id(facts)] = structure(facts)
    return _structures[id(facts)]


def _pair(s: Structure, a: str, b: str) -> tuple[float, ...]:
    key = (id(s), a, b)
    if key not in _features:
        _features[key] = features(s, a, b)
    return _features[key]


setattr(drafting, "structure", _structure)  # noqa: B010 (the draft's own names, memoised)
setattr(drafting, "features", _pair)  # noqa: B010


# --- logistic regression, plainly ----------------------------------------------------------------


def fit(rows: Sequence[Row], labels: Sequence[bool], weight: Sequence[float]) -> list[float]:
    """Intercept first. Identical rows are merged first (most pairs share their features)."""
    merged: dict[tuple[Row, bool], float] = {}
    for x, y, w in zip(rows, labels, weight, strict=True):
        merged[(x, y)] = merged.get((x, y), 0.0) + w
    data = [((1.0, *x), float(y), w) for (x, y), w in sorted(merged.items())]
    size = len(data[0][0])
    beta = [0.0] * size
    for _ in range(50):
        grad = [0.0] * size
        hess = [[0.0] * size for _ in range(size)]
        for x, label, w in data:
            z = sum(b * v for b, v in zip(beta, x, strict=True))
            p = 1 / (1 + math.exp(-max(-50.0, min(50.0, z))))
            r, s = w * (p - label), w * p * (1 - p)
            for i in range(size):
                grad[i] += r * x[i]
                si = s * x[i]
                row = hess[i]
                for j in range(i, size):
                    row[j] += si * x[j]
        for i in range(1, size):
            grad[i] += beta[i]
            hess[i][i] += 1.0
        for i in range(size):
            for j in range(i):
                hess[i][j] = hess[j][i]
        step = _solve(hess, grad)
        beta = [b - d for b, d in zip(beta, step, strict=True)]
        if max(abs(d) for d in step) < 1e-7:
            break
    return beta


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [[*row[:], b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


# --- the three fits ----------------------------------------------------------------------------


def pair_data(ex: Example) -> tuple[list[Row], list[bool]]:
    s = _structure(ex.facts)
    label = {p: i for i, g in enumerate(ex.gold) for p in g}
    paths = ex.facts.paths
    rows, ys = [], []
    for i, a in enumerate(paths):
        for b in paths[i + 1:]:
            rows.append(_pair(s, a, b))
            ys.append(label[a] == label[b])
    return rows, ys


def fit_pairs(data: Sequence[tuple[list[Row], list[bool]]]) -> dict[str, float]:
    rows = [r for d in data for r in d[0]]
    ys = [y for d in data for y in d[1]]
    w = [1 / len(d[0]) for d in data for _ in d[0]]
    beta = fit(rows, ys, w)
    return {"intercept": beta[0], **dict(zip(FEATURES, beta[1:], strict=True))}


def unit_data(ex: Example) -> tuple[list[Row], list[bool]] | None:
    """The timeline's joins and whether gold keeps them together, when the draft reads the
    history as ordered."""
    t = timeline(ex.facts)
    scores = drafting.Scores(_structure(ex.facts), ex.facts.paths)
    if len(t.units) < 2 or not drafting.ordered_history(ex.facts, t, scores):
        return None
    label = {p: i for i, g in enumerate(ex.gold) for p in g}
    majority = [Counter(label[p] for p in u).most_common(1)[0][0] for u in t.units]
    rows = [tuple(x[k] for k in GOES_ON) for x in drafting.goes_on_features(ex.facts, t, scores)]
    return rows, [majority[i] == majority[i + 1] for i in range(len(rows))]


def fit_units(data: Sequence[tuple[list[Row], list[bool]]]) -> dict[str, float]:
    rows = [r for d in data for r in d[0]]
    ys = [y for d in data for y in d[1]]
    w = [1 / len(d[0]) for d in data for _ in d[0]]
    beta = fit(rows, ys, w)
    return {"intercept": beta[0], **dict(zip(GOES_ON, beta[1:], strict=True))}


def ari(ex: Example) -> float:
    return score([list(g.paths) for g in drafting.draft(ex.facts).groups], ex.gold).ari


def linked(ex: Example) -> bool:
    """Whether the draft groups the branch by structure, not by cutting its timeline (whose
    `how` names structure too)."""
    return drafting.group_files(ex.facts).timeline is None


def fit_threshold(data: Sequence[Example]) -> float:
    best = (-2.0, weights.LINK)
    for threshold in THRESHOLDS:
        weights.LINK = threshold
        value = mean(ari(ex) for ex in data) if data else 0.0
        best = max(best, (value, threshold))
    return best[1]


def fit_all(data: Sequence[Example]) -> tuple[dict[str, float], dict[str, float], float]:
    weights.PAIR = fit_pairs([pair_data(ex) for ex in data])
    weights.GOES_ON = fit_units([u for ex in data if (u := unit_data(ex)) is not None])
    weights.LINK = fit_threshold([ex for ex in data if linked(ex)])
    return weights.PAIR, weights.GOES_ON, weights.LINK


def held_out(data: Sequence[Example]) -> dict[tuple[str, str], float]:
    """(range, mode) -> the ARI of its draft with weights fitted on the other projects only
    (the weights are left fitted on the last fold: fit_all again before drafting)."""
    held: dict[tuple[str, str], float] = {}
    for project in sorted({ex.project for ex in data}):
        fit_all([ex for ex in data if ex.project != project])
        held.update({(ex.name, ex.mode): ari(ex) for ex in data if ex.project == project})
    return held


def load(mirrors: str | None, cache: str | None) -> list[Example]:
    """The branches' examples, from `cache` when it exists (and written to it when not)."""
    if cache and Path(cache).exists():
        data: list[Example] = pickle.loads(Path(cache).read_bytes())
        return data
    data = list(examples(mirrors))
    if cache:
        Path(cache).write_bytes(pickle.dumps(data))
    return data


# --- output --------------------------------------------------------------------------------------


def module_text(pair: dict[str, float], goes_on: dict[str, float], threshold: float) -> str:
    def table(values: dict[str, float]) -> str:
        return "\n".join(f"    {k!r}: {v:.3f}," for k, v in values.items())

    doc = Path(weights.__file__).read_text(encoding="utf-8").split('"""')[1]
    return (f'"""{doc}"""\n\nfrom __future__ import annotations\n\n'
            "# a pair of files: log-odds = intercept + the sum of weight * feature "
            f"(plan/evidence.py)\nPAIR = {{\n{table(pair)}\n}}\n"
            "# a unit of the timeline and the next: does the next continue the same piece of "
            f"work?\nGOES_ON = {{\n{table(goes_on)}\n}}\n"
            "# average linkage merges two groups while their pairs' mean log-odds is above "
            f"this\nLINK = {threshold}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors")
    parser.add_argument("--write", action="store_true", help="rewrite plan/weights.py")
    parser.add_argument("--cache", help="keep the branches' facts in this file between runs")
    args = parser.parse_args()
    data = load(args.mirrors, args.cache)
    held = held_out(data)
    pair, goes_on, threshold = fit_all(data)
    print("| mode | ARI, weights fitted on all | ARI, fitted without the range's project |")
    print("|---|---:|---:|")
    for mode in MODES:
        chosen = [ex for ex in data if ex.mode == mode]
        print(f"| {mode} | {mean(ari(ex) for ex in chosen):.3f} | "
              f"{mean(held[(ex.name, mode)] for ex in chosen):.3f} |")
    text = module_text(pair, goes_on, threshold)
    print("\n" + text)
    if args.write:
        Path(weights.__file__).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
