"""A reconstruction as a Markdown job summary (`execute --summary FILE`, for GitHub's
`$GITHUB_STEP_SUMMARY`): the outcome and the tree check, one row per spec commit (its build and
tests with their times, fixes, provenance warnings and tokens), the messy and clean histories
side by side, and where the time went. Every value from the repository is a code span or an
escaped `<pre>` (markup.py)."""

from __future__ import annotations

from itertools import zip_longest

from retcon_sandbox.markup import md_code, md_pre
from retcon_sandbox.summary.facts import (
    LANES,
    Commit,
    Facts,
    Logical,
    final_commit,
    flag_words,
    outcome_line,
    seconds_words,
    stage_words,
)

FLAGS_SHOWN = 5


def _flags(item: Logical) -> str:
    shown = [("⚠ " if f.foreign else "") + md_code(f.path, cell=True)
             + (f" ({flag_words(f)})" if flag_words(f) else "") for f in item.flags[:FLAGS_SHOWN]]
    more = len(item.flags) - FLAGS_SHOWN
    return ", ".join(shown) + (f", … ({more} more)" if more > 0 else "")


def commit_table(facts: Facts) -> list[str]:
    lines = ["| # | commits | build | tests | fixes | content in neither base nor source | "
             "tokens | subject |", "|--:|---|---|---|--:|---|--:|---|"]
    for item in facts.logical:
        last = final_commit(facts, item)
        outcome = last.outcome if last else None
        shas = " ".join(f"`{sha[:7]}`" for sha in item.commits) or item.state
        build, tests = (stage_words(outcome, "build"), stage_words(outcome, "test")) \
            if last else ("-", "-")
        lines.append(f"| {item.number} | {shas} | {build} | {tests} | {item.fixes} | "
                     f"{_flags(item)} | {item.tokens:,} | {md_code(item.subject, cell=True)} |")
    return lines


def _side(commit: Commit | None) -> str:
    if commit is None:
        return ""
    mark = "" if commit.outcome is None else " ✓" if commit.outcome.passed else " ✗"
    return (f"`{commit.sha[:7]}` {md_code(commit.subject, cell=True)} "
            f"(+{commit.added} −{commit.removed}){mark}")


def histories(facts: Facts) -> list[str]:
    lines = ["", "### The messy and the clean history", "",
             f"| messy: {md_code(facts.source, cell=True)} ({len(facts.messy)} commits) | "
             f"clean: {md_code(facts.cleaned, cell=True)} ({len(facts.clean)} commits) |",
             "|---|---|"]
    for messy, clean in zip_longest(facts.messy, facts.clean):
        lines.append(f"| {_side(messy)} | {_side(clean)} |")
    lines += ["", "✓ passed, ✗ failed its build or tests (as recorded in the verification "
              "notes); no mark: no result recorded."]
    return lines


def time_line(facts: Facts) -> list[str]:
    if facts.timeline is None:
        return []
    t = facts.timeline
    parts = ", ".join(f"{lane} {seconds_words(t.total(lane))}" for lane in LANES)
    return ["", f"**Time** of the last run: {seconds_words(t.wall)} in all; {parts} "
            "(steps done ahead overlap)."]


def notes(facts: Facts) -> list[str]:
    lines = []
    for item in facts.logical:
        if item.note:
            lines += ["", f"#{item.number} {item.state}:", "", md_pre(item.note)]
    if any(f.foreign for item in facts.logical for f in item.flags):
        lines += ["", "⚠ marks paths that exist in neither the base nor the source: check them "
                  "before you push."]
    return lines


def run_summary(facts: Facts) -> str:
    complete, line = outcome_line(facts)
    tree = "" if facts.tree_equal is None else \
        " Tree check: cleaned == source ✓" if facts.tree_equal else \
        f" Tree check: ✗ cleaned differs from source in {facts.differing} path(s)"
    head = [f"## retcon-sandbox execute {md_code(facts.title)}", "",
            f"**{'✓' if complete else '✗'} {line}**: {md_code(facts.source)} → "
            f"{md_code(facts.cleaned)} onto {md_code(facts.remote)}.{tree}"
            f" Tokens: {facts.tokens:,}.", ""]
    return "\n".join([*head, *commit_table(facts), *notes(facts), *histories(facts),
                      *time_line(facts)]) + "\n\n"
