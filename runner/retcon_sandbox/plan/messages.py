"""The drafted commits' messages: a messy subject where one describes the commit, else what
changed, in the repository's style (conventional commits when its log uses them)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.order import Derived
from retcon_sandbox.text import sanitize, sanitize_name

SUBJECTS_SHOWN = 6  # messy subjects quoted in a commit's hints

CONVENTIONAL = re.compile(r"^(feat|fix|docs|test|tests|refactor|chore|build|ci|perf|style|"
                          r"revert)(\([^)]*\))?!?: \S")
_WIP = re.compile(r"^\s*(wip|tmp|temp)\b[:\s-]*|[\s(:-]*\b(wip|tmp)\)?\s*$", re.IGNORECASE)
THIN = {"more", "fix", "fixes", "fixed", "oops", "wip", "tmp", "again", "still", "try", "start",
        "finish", "done", "tweak", "tweaks", "nit", "nits"}
NOISE = re.compile(
    r"^(fixup!|squash!|amend!|oops|typos?|fix(es|ed)?|fix (the |a )?(build|tests?|ci|lint|typos?"
    r"|it|stuff|things|bug)|actually fix( it)?|more( \w+)? (stuff|things|changes|work)|stuff|"
    r"changes|updates?|misc|minor|cleanup|clean up|tests?|docs?|wip|remove debug.*|debug.*|"
    r"(address|apply) review.*|review.*|lint.*|format.*|fmt|merge\b.*|\W*)$", re.IGNORECASE)


def conventional(subjects: Iterable[str]) -> bool:
    """Whether a log uses conventional commits (at least half of its subjects)."""
    listed = [s for s in subjects if s.strip()]
    return bool(listed) and sum(bool(CONVENTIONAL.match(s)) for s in listed) * 2 >= len(listed)


def useful(subject: str) -> str | None:
    subject = sanitize(subject)
    text = _WIP.sub("", subject).strip()
    if CONVENTIONAL.match(subject):
        return subject.strip()
    words = text.lower().split()
    if NOISE.match(text) or len(words) < 3 or words[0] in THIN or words[-1] in THIN:
        return None
    return text


def _names(paths: list[str]) -> str:
    """Names for a message: a control character in a name is escaped, never written."""
    shown = [sanitize_name(p) for p in paths]
    if len(shown) <= 2:
        return " and ".join(shown)
    return f"{shown[0]}, {shown[1]} and {len(shown) - 2} more"


def kind_of_group(paths: list[str], d: Derived) -> str:
    kinds = {d.kinds[p] for p in paths}
    if kinds <= {"test"}:
        return "test"
    if kinds <= {"docs"}:
        return "docs"
    return "code"


def _changes(paths: list[str], facts: Facts, d: Derived) -> str:
    """`rename a to b; add c; update d`, leaving out the tests that come along."""
    shown = [p for p in paths if d.kinds[p] != "test"] or paths
    wanted = set(shown)
    blobs = {c.path: (c.old_blob, c.new_blob) for c in facts.changes if c.path in wanted}
    added: dict[str, list[str]] = {}  # a new file's blob, and its base name -> the new files
    for p in shown:
        if d.status[p] == "A":
            for key in (blobs[p][1], p.rsplit("/", 1)[-1]):
                if key:
                    added.setdefault(key, []).append(p)
    parts: list[str] = []
    renamed: set[str] = set()
    for gone in (p for p in shown if d.status[p] == "D"):
        for key in (blobs[gone][0], gone.rsplit("/", 1)[-1]):
            new = next((n for n in added.get(key or "", ()) if n not in renamed), None)
            if new is not None:
                parts.append(f"rename {_names([gone])} to {_names([new])}")
                renamed |= {gone, new}
                break
    for verb, status in (("add", "A"), ("remove", "D"), ("update", "M")):
        files = [p for p in shown if d.status[p] == status and p not in renamed]
        if files:
            parts.append(f"{verb} {_names(files)}")
    return "; ".join(parts[:2]) + (" and more" if len(parts) > 2 else "")


def describe(paths: list[str], facts: Facts, d: Derived, style: bool,
             tested: list[str] | None = None) -> str:
    """A subject saying what changed, when no messy commit says it."""
    group_kind = kind_of_group(paths, d)
    statuses = {d.status[p] for p in paths}
    if group_kind == "test":
        what = f"add tests for {_names(tested)}" if tested else f"update {_names(paths)}"
        kind_word = "test"
    elif group_kind == "docs":
        what, kind_word = _changes(paths, facts, d), "docs"
    else:
        what = _changes(paths, facts, d)
        configs = all(d.kinds[p] == "config" for p in paths)
        kind_word = "build" if configs else "feat" if "A" in statuses else "refactor"
    return f"{kind_word}: {what}" if style else what[0].upper() + what[1:]


def message_for(paths: list[str], facts: Facts, d: Derived, style: bool,
                tested: list[str] | None = None) -> tuple[str, str]:
    """The group's message and hints."""
    members, changed = set(paths), set(d.paths)
    scored: list[tuple[int, int, str]] = []
    sources: list[str] = []
    for i, commit in enumerate(facts.commits):
        inside = members.intersection(commit.paths)
        if not inside:
            continue
        sources.append(commit.subject)
        told = useful(commit.subject)
        if told and 2 * len(inside) >= len(changed.intersection(commit.paths)):
            scored.append((-len(inside), i, told))
    if scored:
        subject = min(scored)[2]
        if style and not CONVENTIONAL.match(subject):
            group_kind = kind_of_group(paths, d)
            prefix = {"test": "test", "docs": "docs"}.get(group_kind) or \
                ("feat" if "A" in {d.status[p] for p in paths} else "refactor")
            subject = f"{prefix}: {subject[0].lower()}{subject[1:]}"
        elif not style and not CONVENTIONAL.match(subject):  # `feat: x` keeps its case
            subject = subject[0].upper() + subject[1:]
    else:
        subject = describe(paths, facts, d, style, tested)
    distinct = list(dict.fromkeys(sources))
    quoted = ", ".join(f"'{sanitize(s)}'" for s in distinct[:SUBJECTS_SHOWN]) + \
        (f" and {len(distinct) - SUBJECTS_SHOWN} more" if len(distinct) > SUBJECTS_SHOWN else "")
    listed = ", ".join(sanitize_name(p) for p in paths[:10]) + \
        (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    hints = (f"Take {listed} as on the source branch"
             + (f" (changed in the messy commits {quoted})" if quoted else "") + ".")
    return subject, hints


