"""`retcon-sandbox status SPEC`: each commit's state, from the spec alone."""

from __future__ import annotations

import json
from pathlib import Path

from runner.errors import EXIT_OK
from runner.history import Blocked, Done, Extract, Fresh, Next, Verify, commits_created, next_step
from runner.spec import load


def describe(step: Next) -> tuple[str, str]:
    if isinstance(step, Done):
        return "complete", "✓"
    if isinstance(step, Fresh):
        return "pending", "·"
    if isinstance(step, Blocked):
        return "stuck", "✗"
    if isinstance(step, (Extract, Verify)) and step.note and not step.interrupted:
        return "resolved", "↻"
    return "in progress", "…"


def run(path: Path, as_json: bool) -> int:
    spec = load(path)
    rows = []
    for commit in spec.commits:
        history = list(commit.history)
        step = next_step(history)
        state, mark = describe(step)
        rows.append({"number": commit.number, "subject": commit.subject, "state": state,
                     "commits": len(commits_created(history)),
                     "stuck": step.summary if isinstance(step, Blocked) else None,
                     "mark": mark})
    if as_json:
        print(json.dumps({"spec": str(path), "source": spec.source, "cleaned": spec.cleaned,
                          "commits": rows}))
        return EXIT_OK
    print(f"{path.name}: {spec.source} → {spec.cleaned} (onto {spec.remote})")
    for row in rows:
        extra = f"  {row['commits']} commit(s)" if row["commits"] else ""
        print(f"  {row['mark']} #{row['number']} {row['state']:<12} {row['subject']}{extra}")
        if row["stuck"]:
            print(f"      stuck: {row['stuck']}")
            print('      add { resolved = "what you changed" } after it, then rerun execute')
    done = sum(1 for r in rows if r["state"] == "complete")
    print(f"  {done}/{len(rows)} complete")
    return EXIT_OK
