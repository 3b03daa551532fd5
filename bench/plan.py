"""How close the deterministic planner comes to a careful person's plan, side by side with the
naive baselines, on the demo and three real-shape fixtures (tests/plan/fixtures.py).

    python3 bench/plan.py

For each messy branch: the draft `retcon-sandbox plan` writes (no model), one commit per
directory, and one commit per messy commit (each file in the last one that touched it), each
scored against the gold plan: pairwise precision and recall (of the pairs of files the gold plan
puts in one commit), the adjusted Rand index (1 = the gold grouping, 0 = chance) and the number
of commits. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retcon_sandbox.commands.plan import choose, read_facts
from retcon_sandbox.plan.draft import draft
from retcon_sandbox.plan.score import Score, per_directory, per_messy_commit, score
from tests.plan.fixtures import ALL


def row(name: str, how: str, s: Score) -> str:
    return (f"| {name} | {how} | {s.precision:.2f} | {s.recall:.2f} | {s.ari:.2f} | "
            f"{s.groups} / {s.gold_groups} |")


def main() -> None:
    print("| branch | plan | pair precision | pair recall | ARI | commits / gold |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="retcon-bench-plan-") as tmp:
        for fixture in ALL:
            repo = fixture.create(Path(tmp) / fixture.name)
            facts = read_facts(choose(repo, "feature", "main", None))
            gold = fixture.gold_groups
            planned = [list(g.paths) for g in draft(facts)]
            last = {p: i for i, c in enumerate(facts.commits) for p in c.paths}
            label = f"{fixture.name} ({len(facts.changes)} files, {len(facts.commits)} commits)"
            print(row(label, "**plan (deterministic)**", score(planned, gold)))
            print(row(label, "one per directory", score(per_directory(facts.paths), gold)))
            print(row(label, "one per messy commit",
                      score(per_messy_commit(facts.paths, last), gold)))


if __name__ == "__main__":
    main()
