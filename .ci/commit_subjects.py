#!/usr/bin/env python3
"""Check the subjects of the commits made after a base commit (CONTRIBUTING.md says why).

Older commits are left as they are: main's history is never rewritten. A subject must be at
most 72 characters, have no trailing period, and read as an order. The mood check is a
heuristic: after an optional `scope: ` prefix, the first word must not be an article or a
past, -ing or third-person form ("added", "adding", "adds", "fixes"). Merge commits count too;
git's own `Merge branch 'x'` passes.

Exit 0 when every subject passes, 1 when one fails. Exit 2 when the history cannot be checked:
a shallow clone without the base commit, or a repository without it.

    .ci/commit_subjects.py [--base SHA] [REV]     # REV: the tip to check (default HEAD)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

# main's tip when the rule was made (issue 40); commits after it are checked.
BASE = "6cabb7418ae9d74f7c69923e199c2c4555cfdf73"
LIMIT = 72
ARTICLES = frozenset({"a", "an", "the"})
# Words that end like a past, -ing or third-person form but are orders.
ORDERS = frozenset({
    "embed", "exceed", "feed", "need", "proceed", "seed", "shed", "speed", "succeed",
    "bring", "ping", "string", "focus",
})
NOT_ORDERS = ("fixup! ", "squash! ", "amend! ")
FIELD = "\x1f"


def problems(subject: str) -> list[str]:
    """What is wrong with one subject; nothing when it passes."""
    found = []
    if len(subject) > LIMIT:
        found.append(f"{len(subject)} characters (at most {LIMIT})")
    if subject.endswith("."):
        found.append("ends with a period")
    if subject.startswith(NOT_ORDERS) or re.match(r"wip\b", subject, re.IGNORECASE):
        found.append("a work-in-progress commit (squash it)")
    elif (word := first_word(subject)) and not_an_order(word):
        found.append(f"starts with {word!r}: say what the commit does, as an order "
                     f"(\"add\", \"fix\", not \"added\", \"fixes\", \"the\")")
    if not subject.strip():
        found.append("empty")
    return found


def first_word(subject: str) -> str:
    """The first word after an optional `scope: ` prefix, lower case."""
    rest = subject.split(": ", 1)[1] if ": " in subject else subject
    match = re.match(r"[A-Za-z'-]+", rest.strip())
    return match.group(0).lower() if match else ""


def not_an_order(word: str) -> bool:
    if word in ORDERS:
        return False
    if word in ARTICLES:
        return True
    third_person = word.endswith("s") and not word.endswith("ss")  # "adds", not "pass"
    return word.endswith(("ed", "ing")) or third_person


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def unreadable(base: str) -> str | None:
    """Why base..REV cannot be listed, with what to do; None when it can."""
    if git("rev-parse", "--git-dir").returncode != 0:
        return None  # not a checkout (an unpacked sdist): main() says so
    if git("cat-file", "-e", f"{base}^{{commit}}").returncode == 0:
        return None
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return (f"the base commit {base[:12]} is not in this shallow clone, so the commits "
                "after it cannot be told apart. Fetch the history (`git fetch --unshallow`, "
                "or `fetch-depth: 0` on GitHub) and run again.")
    return (f"the base commit {base[:12]} is not in this repository: its history was "
            "rewritten, or it is not retcon-sandbox's. Check against a commit it has: "
            "--base SHA.")


def subjects(base: str, rev: str) -> list[tuple[str, str]]:
    """(commit, subject) of every commit in base..rev, merges included, oldest first."""
    listed = git("log", "--reverse", f"--format=%H{FIELD}%s", f"{base}..{rev}", "--")
    if listed.returncode != 0:
        print(f"commit subjects: git log {base[:12]}..{rev} failed: {listed.stderr.strip()}",
              file=sys.stderr)
        raise SystemExit(2)
    pairs = (line.split(FIELD, 1) for line in listed.stdout.splitlines())
    return [(sha, subject) for sha, subject in pairs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("rev", nargs="?", default="HEAD", help="the tip to check (HEAD)")
    parser.add_argument("--base", default=BASE, help="check the commits after this one")
    args = parser.parse_args(argv)
    if git("rev-parse", "--git-dir").returncode != 0:
        print(f"commit subjects: {Path.cwd()} is not a git checkout; nothing to check")
        return 0
    problem = unreadable(args.base)
    if problem:
        print(f"commit subjects: {problem}", file=sys.stderr)
        return 2
    listed = subjects(args.base, args.rev)
    failures = [(sha, subject, why) for sha, subject in listed if (why := problems(subject))]
    for sha, subject, why in failures:
        print(f"{sha[:12]} {subject}\n    " + "; ".join(why), file=sys.stderr)
    print(f"commit subjects: {len(listed)} after {args.base[:12]}, {len(failures)} to reword"
          + (" (CONTRIBUTING.md: Commits)" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
