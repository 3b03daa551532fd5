"""What a branch whose files were dealt out at random still says, on the planner benchmark's
real ranges (bench/plan_ranges.toml, made `shuffled` as in bench/plan.py): how far structure
tells which files share a commit, and whether anything tells the commits' order.

    python3 bench/plan_signals.py [--mirrors DIR] [--only TEXT] [--ranges FILE]

It prints:
1. the pair model's ranking power: per range, the area under the ROC curve of the draft's pair
   log-odds (plan/weights.py) for "one gold commit" (0.5 is chance, 1 is perfect);
2. where each role's files fall in the gold order (0 is the first commit, 1 the last);
3. what imports and definitions order (plan/order.py): of the pairs "a needs b" in different
   gold commits, the share where b's commit is first;
4. the order agreement of the draft's own groups under other ranks: smaller work first (the
   draft: the mean of log(1 + lines changed)), larger work first, by role (the earlier draft), by
   path, by path reversed, none (the draft's order of needs only), most files first.
Gold puts each file in the last real commit that touched it. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan import order_agreement
from realhistory import (
    RANGES,
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
from retcon_sandbox.plan.evidence import Structure, structure
from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.kinds import role
from retcon_sandbox.plan.order import derive
from retcon_sandbox.repo.gitrepo import Repo

Ranks = Callable[[list[list[str]], Structure], list[float]]


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """The chance that a pair of one commit scores above a pair of two (ties count half)."""
    pos = sorted(s for s, y in zip(scores, labels, strict=True) if y)
    neg = sorted(s for s, y in zip(scores, labels, strict=True) if not y)
    if not pos or not neg:
        return None
    wins = 0.0
    for s in pos:
        below = sum(1 for n in neg if n < s)
        ties = sum(1 for n in neg if n == s)
        wins += below + ties / 2
    return wins / (len(pos) * len(neg))


def pair_auc(facts: Facts, label: dict[str, int]) -> float | None:
    scores = drafting.Scores(structure(facts), facts.paths)
    paths = facts.paths
    pairs = [(a, b) for i, a in enumerate(paths) for b in paths[i + 1:]]
    return auc([scores(a, b) for a, b in pairs], [label[a] == label[b] for a, b in pairs])


def positions(gold_plan: list[list[str]]) -> dict[str, float]:
    """Each role's mean place in the gold order, from 0 (first commit) to 1 (last)."""
    out: dict[str, list[float]] = defaultdict(list)
    last = max(1, len(gold_plan) - 1)
    for i, group in enumerate(gold_plan):
        for p in group:
            out[role(p)].append(i / last)
    return {r: mean(v) for r, v in out.items()}


def needs_agree(facts: Facts, label: dict[str, int]) -> tuple[int, int]:
    d = derive(facts)
    pairs = [(label[p], label[q]) for p, qs in d.deps.items() for q in qs if label[p] != label[q]]
    return sum(q < p for p, q in pairs), len(pairs)


def _index(paths: Sequence[str]) -> dict[str, int]:
    return {p: i for i, p in enumerate(paths)}


SIZE_RANKS = drafting._size_ranks  # the draft's own, kept while a variant stands in for it


def _path_ranks(groups: list[list[str]], s: Structure, sign: float) -> list[float]:
    index = _index(list(s.roles))  # the diff's order
    return [sign * min(index[x] for x in group) for group in groups]


VARIANTS: dict[str, Ranks] = {
    "smaller work first (the draft)": SIZE_RANKS,
    "larger work first": lambda g, s: [-x for x in SIZE_RANKS(g, s)],
    "by role (the earlier draft)": lambda g, s: drafting._role_ranks(g, s.roles, list(s.roles)),
    "by path": lambda g, s: _path_ranks(g, s, 1.0),
    "by path reversed": lambda g, s: _path_ranks(g, s, -1.0),
    "needs only": lambda g, s: [0.0] * len(g),
    "most files first": lambda g, s: [-float(len(group)) for group in g],
}


def orders(facts: Facts, gold_plan: list[list[str]]) -> dict[str, float]:
    out = {}
    try:
        for name, ranks in VARIANTS.items():
            setattr(drafting, "_size_ranks", ranks)  # noqa: B010 (the draft's own name)
            groups = [list(g.paths) for g in drafting.draft(facts).groups]
            out[name] = order_agreement(groups, gold_plan)
    finally:
        setattr(drafting, "_size_ranks", SIZE_RANKS)  # noqa: B010
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors")
    parser.add_argument("--only")
    parser.add_argument("--ranges", type=Path, default=RANGES,
                        help="the ranges (default: bench/plan_ranges.toml)")
    args = parser.parse_args()
    roots = mirror_roots(args.mirrors)
    aucs: list[float] = []
    roles: dict[str, list[float]] = defaultdict(list)
    agree = total = 0
    order_rows: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="retcon-bench-signals-") as tmp:
        for r in load_ranges(args.ranges):
            if args.only and args.only not in r.name:
                continue
            mirror = find_mirror(r.repo, roots)
            directory = build(Path(tmp) / r.name.replace("/", "+"), mirror, r,
                              messify(mirror, r, "shuffled"))
            facts = read_facts(choose(Repo(directory), "feature", "main", None))
            gold_plan = gold(real_steps(mirror, r), facts.paths)
            label = {p: i for i, g in enumerate(gold_plan) for p in g}
            if (value := pair_auc(facts, label)) is not None:
                aucs.append(value)
            for name, where in positions(gold_plan).items():
                roles[name].append(where)
            a, t = needs_agree(facts, label)
            agree, total = agree + a, total + t
            for name, value in orders(facts, gold_plan).items():
                order_rows[name].append(value)
    print(f"pair log-odds, ROC AUC for one gold commit: mean {mean(aucs):.3f} over {len(aucs)} "
          f"ranges (min {min(aucs):.2f}, max {max(aucs):.2f})\n")
    print("| role | ranges | mean place in gold order (0 first, 1 last) |\n|---|---:|---:|")
    for name, values in sorted(roles.items(), key=lambda kv: mean(kv[1])):
        print(f"| {name} | {len(values)} | {mean(values):.2f} |")
    print(f"\nneeds (imports, definitions) across gold commits: {agree} of {total} in gold "
          "order\n")
    print("| ranks of the draft's groups | order agreement |\n|---|---:|")
    for name, values in order_rows.items():
        print(f"| {name} | {mean(values):.3f} |")


if __name__ == "__main__":
    main()
