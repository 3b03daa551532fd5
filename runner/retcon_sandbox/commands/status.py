"""`retcon-sandbox status SPEC`: each commit's state, from the spec alone. Exits 3 when a commit
is stuck, so scripts can tell."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from retcon_sandbox.errors import EXIT_OK, EXIT_STUCK
from retcon_sandbox.report import SCHEMA, json_text
from retcon_sandbox.spec.file import load
from retcon_sandbox.spec.history import (
    Blocked,
    Done,
    Extract,
    Fresh,
    Next,
    Verify,
    commits_created,
    next_step,
)
from retcon_sandbox.text import indent, sanitize


def describe(step: Next) -> tuple[str, str]:
    if isinstance(step, Done):
        return ("nothing to extract", "∅") if step.nothing is not None else ("complete", "✓")
    if isinstance(step, Fresh):
        return "pending", "·"
    if isinstance(step, Blocked):
        return "stuck", "✗"
    if isinstance(step, Extract | Verify) and step.note and not step.interrupted:
        return "resolved", "↻"
    return "in progress", "…"


def _labelled(label: str, text: str) -> str:
    """`      label: first line`, the next lines aligned under the first."""
    head = f"      {label}: "
    return head + indent(text, " " * len(head))


def run(args: argparse.Namespace) -> int:
    path = Path(args.spec)
    spec = load(path)
    rows: list[dict[str, Any]] = []
    for commit in spec.commits:
        step = next_step(commit.history)
        state, mark = describe(step)
        rows.append({"number": commit.number, "subject": commit.subject, "state": state,
                     "commits": len(commits_created(commit.history)),
                     "stuck": step.summary if isinstance(step, Blocked) else None,
                     "nothing": step.nothing if isinstance(step, Done) else None,
                     "mark": mark})
    stuck = any(r["state"] == "stuck" for r in rows)
    if args.json:
        print(json_text({"schema": SCHEMA, "spec": str(path), "source": spec.source,
                         "cleaned": spec.cleaned, "commits": rows}))
        return EXIT_STUCK if stuck else EXIT_OK
    lines = [f"{path.name}: {spec.source} → {spec.cleaned} (onto {spec.remote})"]
    for row in rows:
        extra = f"  {row['commits']} commit(s)" if row["commits"] else ""
        lines.append(f"  {row['mark']} #{row['number']} {row['state']:<12} {row['subject']}"
                     f"{extra}")
        if row["stuck"]:
            lines.append(_labelled("stuck", row["stuck"]))
            lines.append('      add { resolved = "what you changed" } after it, then rerun '
                         "execute")
        if row["nothing"]:
            lines.append(_labelled("nothing to extract", row["nothing"]))
    done = sum(1 for r in rows if r["state"] in ("complete", "nothing to extract"))
    lines.append(f"  {done}/{len(rows)} complete")
    print(sanitize("\n".join(lines)))
    return EXIT_STUCK if stuck else EXIT_OK
