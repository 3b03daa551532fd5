"""Progress output: readable lines for a person, or one JSON event per line for CI."""

from __future__ import annotations

import json
import sys
from typing import Any, Protocol, TextIO


class Reporter(Protocol):
    def emit(self, event: str, **data: Any) -> None: ...


class JsonReporter:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def emit(self, event: str, **data: Any) -> None:
        self.out.write(json.dumps({"event": event, **data}, ensure_ascii=False) + "\n")
        self.out.flush()


def _short(sha: str | None) -> str:
    return (sha or "")[:7]


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# One formatter per event; the JSON reporter sends the same events with their raw fields.
FORMATS: dict[str, Any] = {
    "spec": lambda d: (f"Loading spec: {d['path']}\n  Source: {d['source']}\n"
                       f"  Remote: {d['remote']}\n  Cleaned: {d['cleaned']}\n"
                       f"  Sandbox: {d['sandbox']}"),
    "warning": lambda d: f"\n  ⚠ {d['message']}",
    "reaped": lambda d: f"  Removed {d['count']} leftover sandbox container(s) of an earlier run",
    "branch_created": lambda d: (f"\nCreating cleaned branch from merge-base...\n"
                                 f"  Base commit: {_short(d['base'])}"),
    "branch_continued": lambda d: (f"\nContinuing cleaned branch {d['branch']} at "
                                   f"{_short(d['tip'])}"),
    "resume": lambda d: f"\nResuming from commit {d['number']}/{d['total']}: {d['subject']}",
    "commit_start": lambda d: f"\nCommit {d['number']}/{d['total']}: {d['subject']}",
    "resolved": lambda d: f"  Resolved: {d['note']}",
    "recovered": lambda d: f"  Recovering an interrupted run: {d['what']}",
    "sandbox": lambda d: f"  Sandbox ready ({d['files']} files, {d['seconds']:.1f}s)",
    "diff": lambda d: f"  Computing diff ({d['lines']} lines)...",
    "extracting": lambda d: "  Extracting relevant changes...",
    "taking_paths": lambda d: "  Taking paths from source: " + ", ".join(d["paths"]),
    "creating_commit": lambda d: f"  Creating commit... {_short(d['sha'])}",
    "build": lambda d: f"  Building... {d['verdict']}",
    "tests": lambda d: f"  Tests... {d['verdict']}",
    "failure_output": lambda d: _indent(d["tail"]),
    "assessing": lambda d: "\n  Assessing progress...",
    "fix_attempt": lambda d: f"  Fix attempt {d['attempt']}:",
    "fix_done": lambda d: f"    {d['message']}\n    Creating fixup commit... {_short(d['sha'])}",
    "no_progress": lambda d: f"    No progress: {d['why']}",
    "llm_stuck": lambda d: "  LLM: " + _indent(f'"{d["summary"]}"', "").replace("\n", "\n       "),
    "stuck": lambda d: "\n  ✗ Stuck - stopping",
    "auto_response": lambda d: f"  Using the pre-written response: {d['text']}",
    "commit_complete": lambda d: ("  ✓ Commit created" + (f" ({d['fixes']} fix)" if d["fixes"] == 1
                                  else f" ({d['fixes']} fixes)" if d["fixes"] else "")),
    "remainder": lambda d: (f"\nRemaining: the commits left {len(d['paths'])} path(s) different "
                            "from source"),
    "assigning": lambda d: "  Assigning them to commits...",
    "remainder_commit": lambda d: (f"\nRemaining changes for commit {d['number']}: "
                                   f"{d['subject']}\n  " + ", ".join(d["paths"])),
    "leftover_commit": lambda d: ("\nUnclaimed changes, in a catch-all commit on top:\n  "
                                  + ", ".join(d["paths"])),
    "leftover": lambda d: ("\n  ⚠⚠ WARNING: the spec's commits did not cover everything. "
                           f"{len(d['paths'])} path(s) went into a final catch-all commit "
                           f"{_short(d['sha'])}:\n" + _indent("\n".join(d["paths"]))
                           + "\n    Add them to a [[commit]] (paths or hints) for a clean story."),
    "squashed": lambda d: f"\nSquashed fix commits: {d['commits']} commits, tip {_short(d['tip'])}",
    "tree_check": lambda d: ("\nTree check: cleaned == source ✓" if d["equal"] else
                             f"\nTree check: ✗ cleaned differs from source in {d['differing']} "
                             "path(s)"),
    "summary": lambda d: _summary(d),
}


def _summary(d: dict[str, Any]) -> str:
    lines = ["", "Complete!" if d["complete"] else "Stopped.",
             f"  {d['logical']} logical commits created",
             f"  {d['fixes']} fix commits",
             f"  Branch: {d['branch']}"]
    tokens = d.get("tokens") or {}
    if tokens:
        lines.append("  Tokens: " + ", ".join(f"{'#' if k.isdigit() else ''}{k} {v:,}"
                                              for k, v in tokens.items()))
    if d["fixes"] and d.get("base"):
        lines += ["", "To squash fix commits:",
                  f"  git rebase -i --autosquash {_short(d['base'])} {d['branch']}",
                  "  (or rerun with --squash-wip)"]
    return "\n".join(lines)


class HumanReporter:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def emit(self, event: str, **data: Any) -> None:
        render = FORMATS.get(event)
        if render is None:
            return
        self.out.write(render(data) + "\n")
        self.out.flush()
