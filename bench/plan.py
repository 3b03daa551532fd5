"""How close `plan`'s draft comes to the real history, beside the naive baselines, on real
first-parent ranges of public projects (bench/plan_ranges.toml) made messy three ways
(bench/realhistory.py).

    python3 bench/plan.py [--mirrors DIR] [--mode sequential|shuffled|human] [--only TEXT]
    python3 bench/plan.py --fetch     # clone the listed projects where GitHub answers
    python3 bench/plan.py --ranges bench/plan_heldout.toml   # projects the fit never saw

Gold puts each changed file in the last real commit that touched it. Each draft and baseline
is scored on: the adjusted Rand index of the file-to-commit assignment (ARI: 1 = the gold
grouping, 0 = chance), pairwise precision, recall and F1 (of the pairs of files put in one
commit), order agreement (of the pairs of files both put in different commits, the share put
in the gold order), commits against gold, and exact coverage (every changed file in exactly
one commit). The baselines: one commit per top-level folder, one per folder, one per messy
commit (each file in the last one that touched it); a baseline's commits are ordered by when
the messy branch last touched them. `before` is the draft of 0.3.0 (commit 6cabb74) on the same
branches, kept in plan_before.json. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))  # this checkout's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realhistory import (
    MODES,
    RANGES,
    Range,
    build,
    fetch_repos,
    find_mirror,
    gold,
    load_ranges,
    messify,
    mirror_roots,
    real_steps,
)

from retcon_sandbox.commands.plan import choose, read_facts
from retcon_sandbox.plan.draft import draft
from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.score import labels, score

Plan = list[list[str]]
BEFORE = Path(__file__).with_name("plan_before.json")  # the draft of 0.3.0 on these ranges


@dataclass(frozen=True)
class Figures:
    ari: float
    precision: float
    recall: float
    f1: float
    order: float
    commits: int
    gold: int
    exact: bool


def order_agreement(plan: Sequence[Sequence[str]], gold_plan: Sequence[Sequence[str]]) -> float:
    """Of the pairs of files that both plans put in different commits, the share in the same
    order (1.0 when there is no such pair)."""
    a, b = labels(plan), labels(gold_plan)
    files = sorted(set(a) & set(b))
    agree = total = 0
    for i, p in enumerate(files):
        for q in files[i + 1:]:
            if a[p] != a[q] and b[p] != b[q]:
                total += 1
                agree += (a[p] < a[q]) == (b[p] < b[q])
    return agree / total if total else 1.0


def figures(plan: Plan, gold_plan: Plan, changed: Sequence[str]) -> Figures:
    s = score(plan, gold_plan)
    placed = [p for g in plan for p in g]
    exact = sorted(placed) == sorted(changed)
    f1 = 2 * s.precision * s.recall / (s.precision + s.recall) if s.precision + s.recall else 0
    return Figures(s.ari, s.precision, s.recall, f1, order_agreement(plan, gold_plan),
                   len(plan), len(gold_plan), exact)


def _by(paths: Sequence[str], key: Callable[[str], str], facts: Facts) -> Plan:
    last = {p: i for i, c in enumerate(facts.commits) for p in c.paths}
    out: dict[str, list[str]] = {}
    for p in paths:
        out.setdefault(key(p), []).append(p)
    return sorted(out.values(), key=lambda g: max(last.get(p, -1) for p in g))


def baselines(facts: Facts) -> dict[str, Plan]:
    last = {p: i for i, c in enumerate(facts.commits) for p in c.paths}
    return {
        "top folder": _by(facts.paths, lambda p: p.split("/")[0] if "/" in p else ".", facts),
        "folder": _by(facts.paths, lambda p: p.rsplit("/", 1)[0] if "/" in p else ".", facts),
        "messy commit": _by(facts.paths, lambda p: str(last.get(p, -1)).zfill(6), facts),
    }


@dataclass(frozen=True)
class Row:
    range: str
    mode: str
    files: int
    messy: int
    seconds: float
    plan: Figures
    base: dict[str, Figures]


def measure(r: Range, mode: str, mirror: Path, tmp: Path) -> Row:
    repo_dir = build(tmp / f"{r.name.replace('/', '+')}-{mode}", mirror, r,
                     messify(mirror, r, mode))
    from retcon_sandbox.repo.gitrepo import Repo

    facts = read_facts(choose(Repo(repo_dir), "feature", "main", None))
    gold_plan = gold(real_steps(mirror, r), facts.paths)
    started = time.perf_counter()
    planned = [list(g.paths) for g in draft(facts).groups]
    seconds = time.perf_counter() - started
    return Row(r.name, mode, len(facts.paths), len(facts.commits), seconds,
               figures(planned, gold_plan, facts.paths),
               {name: figures(b, gold_plan, facts.paths) for name, b in baselines(facts).items()})


def show(rows: list[Row]) -> None:
    names = list(rows[0].base)
    print("| range | mode | files | messy | gold | plan ARI (F1) | order | commits | "
          + " | ".join(f"{n} ARI (F1)" for n in names) + " |")
    print("|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names))
    for row in rows:
        p = row.plan
        worse = " ✗" if p.ari < row.base["top folder"].ari - 0.05 else ""
        print(f"| {row.range} | {row.mode} | {row.files} | {row.messy} | {p.gold} | "
              f"{p.ari:.2f} ({p.f1:.2f}){worse} | {p.order:.2f} | {p.commits} | "
              + " | ".join(f"{row.base[n].ari:.2f} ({row.base[n].f1:.2f})" for n in names)
              + " |")


def summary(rows: list[Row], before: dict[str, dict[str, float]]) -> None:
    print("\n| mode | ranges | plan ARI | before | F1 | precision | recall | order | before | "
          "commits/gold | exact | worse than top folder −0.05 | top folder ARI (F1) | "
          "folder ARI | messy commit ARI | seconds (max) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in dict.fromkeys(r.mode for r in rows):
        sel = [r for r in rows if r.mode == mode]
        p = [r.plan for r in sel]
        worse = sum(r.plan.ari < r.base["top folder"].ari - 0.05 for r in sel)
        old = [before[k] for r in sel if (k := f"{r.range} {r.mode}") in before]
        was = (f"{mean(x['ari'] for x in old):.3f}", f"{mean(x['order'] for x in old):.3f}") \
            if len(old) == len(sel) else ("", "")
        print(f"| {mode} | {len(sel)} | {mean(x.ari for x in p):.3f} | {was[0]} | "
              f"{mean(x.f1 for x in p):.3f} | {mean(x.precision for x in p):.2f} | "
              f"{mean(x.recall for x in p):.2f} | {mean(x.order for x in p):.3f} | {was[1]} | "
              f"{mean(x.commits / x.gold for x in p):.2f} | {sum(x.exact for x in p)}/"
              f"{len(p)} | {worse} | {mean(r.base['top folder'].ari for r in sel):.3f} "
              f"({mean(r.base['top folder'].f1 for r in sel):.2f}) | "
              f"{mean(r.base['folder'].ari for r in sel):.3f} | "
              f"{mean(r.base['messy commit'].ari for r in sel):.3f} | "
              f"{max(r.seconds for r in sel):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors", help="a folder holding the projects' git directories")
    parser.add_argument("--mode", choices=MODES, action="append")
    parser.add_argument("--only", help="only the ranges whose name contains this")
    parser.add_argument("--ranges", type=Path, default=RANGES,
                        help="the ranges to draft (default: bench/plan_ranges.toml)")
    parser.add_argument("--fetch", action="store_true", help="clone the projects, then stop")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--quiet", action="store_true", help="the summary only")
    args = parser.parse_args()
    ranges = [r for r in load_ranges(args.ranges) if not args.only or args.only in r.name]
    roots = mirror_roots(args.mirrors)
    if args.fetch:
        fetch_repos(ranges, roots[0])
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="retcon-bench-plan-") as tmp:
        for r in ranges:
            mirror = find_mirror(r.repo, roots)
            for mode in args.mode or MODES:
                rows.append(measure(r, mode, mirror, Path(tmp)))
    if not args.quiet:
        show(rows)
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else {}
    summary(rows, before)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
