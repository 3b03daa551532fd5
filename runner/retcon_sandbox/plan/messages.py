"""The drafted commits' messages: a messy subject where one describes the commit, else what
changed, in the repository's style (conventional commits when its log uses them)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.order import Derived
from retcon_sandbox.text import sanitize, sanitize_name

SUBJECTS_SHOWN = 6  # messy subjects quoted in a commit's hints
SUBJECT_MAX = 72  # a drafted subject's characters at most; the whole text goes in the body

_TYPES = r"(feat|fix|docs|test|tests|refactor|chore|build|ci|perf|style|revert)"
CONVENTIONAL = re.compile(rf"^{_TYPES}(\([^)]*\))?!?: \S")
TYPE = re.compile(rf"^{_TYPES}(?=(\([^)]*\))?!?: \S)", re.IGNORECASE)  # a type, any case
_FIXUP = re.compile(r"^\s*((fixup|squash|amend)! *)+", re.IGNORECASE)  # says its target's
# a leading `wip:` or a trailing `(wip)`; a trailing run starts where the run of separators
# does (the lookbehind), so a long run of spaces costs linear time
_WIP = re.compile(r"^\s*(wip|tmp|temp)\b[:\s-]*|(?<![\s(:-])[\s(:-]*\b(wip|tmp)\)?\s*$",
                  re.IGNORECASE)
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
    """What a messy subject says of its commit, or None: `fixup! X` says what X says."""
    subject = " ".join(_FIXUP.sub("", sanitize(subject)).split())  # tabs, runs of spaces
    text = _WIP.sub("", subject).strip()
    if CONVENTIONAL.match(subject):
        return subject.strip()
    words = text.lower().split()
    if NOISE.match(text) or len(words) < 3 or words[0] in THIN or words[-1] in THIN:
        return None
    return text


def _names(paths: list[str], level: int = 0) -> str:
    """Names for a message, shorter at each level: two paths, one, one file's name (when no
    other of `paths` has it), a count. A control character in a name is escaped, never
    written."""
    shown = [sanitize_name(p) for p in paths]
    names = [name.rsplit("/", 1)[-1] for name in shown]
    if level == 2 and len(set(names)) < len(names):
        level = 3  # `humanize.mo and 2 more` would not say which
    if level >= 2:
        shown = names
    if level >= 3 and len(shown) > 1:
        where = sanitize_name(_common_folder(paths))
        return f"{len(shown)} files" + (f" in {where}" if where else "")
    if len(shown) == 1 or (level == 0 and len(shown) == 2):
        return " and ".join(shown)
    if level == 0:
        return f"{shown[0]}, {shown[1]} and {len(shown) - 2} more"
    return f"{shown[0]} and {len(shown) - 1} more"


def _common_folder(paths: list[str]) -> str:
    """The deepest folder that holds all of `paths` ("" for the root)."""
    common: list[str] = []
    for column in zip(*(p.split("/")[:-1] for p in paths), strict=False):
        if len(set(column)) > 1:
            break
        common.append(column[0])
    return "/".join(common)


def _cased(subject: str, upper: bool) -> str:
    """The subject with its first word capitalised (or not), when that word is a plain word:
    `README: …`, `strutils.singularize: …` and `API …` stay as they are."""
    word = subject.split(" ", 1)[0]
    plain = word.isalpha() and (word.islower() or (word[0].isupper() and word[1:].islower()))
    if not plain:
        return subject
    return (subject[0].upper() if upper else subject[0].lower()) + subject[1:]


def fitted(subject: str) -> tuple[str, str]:
    """A subject of at most SUBJECT_MAX characters, and the whole text as a body when it had
    to be shortened: its first sentence when that says something (three words or more), else
    its words up to the limit, or its characters when a word would leave less than half."""
    if len(subject) <= SUBJECT_MAX:
        return subject, ""
    first = re.split(r"(?<=[.!?])\s+", subject, maxsplit=1)[0].rstrip(".")
    if len(first) > SUBJECT_MAX or len(first.split()) < 3:
        cut = subject[:SUBJECT_MAX - 3]
        words = cut.rsplit(" ", 1)[0].rstrip(" ,;:-")
        first = (words if len(words) >= SUBJECT_MAX // 2 else cut.rstrip()) + "..."
    return first, textwrap.fill(subject, SUBJECT_MAX, break_long_words=False,
                                break_on_hyphens=False)


def unique(message: str, taken: set[str]) -> str:
    """The message, its subject numbered (`Update __init__.py (2)`) while an earlier commit
    has it, within SUBJECT_MAX characters."""
    subject, _, rest = message.partition("\n")
    number, candidate = 1, subject
    while candidate in taken:
        number += 1
        suffix = f" ({number})"
        candidate = subject[:SUBJECT_MAX - len(suffix)].rstrip() + suffix
    return candidate + (f"\n{rest}" if rest else "")


def kind_of_group(paths: list[str], d: Derived) -> str:
    kinds = {d.kinds[p] for p in paths}
    if kinds <= {"test"}:
        return "test"
    if kinds <= {"docs"}:
        return "docs"
    return "code"


def _changes(paths: list[str], facts: Facts, d: Derived, level: int) -> str:
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
                named = level if _names([gone], level) != _names([new], level) else 1
                parts.append(f"rename {_names([gone], named)} to {_names([new], named)}")
                renamed |= {gone, new}
                break
    for verb, status in (("add", "A"), ("remove", "D"), ("update", "M")):
        files = [p for p in shown if d.status[p] == status and p not in renamed]
        if files:
            parts.append(f"{verb} {_names(files, level)}")
    shown_parts = 1 if level >= 3 else 2
    return "; ".join(parts[:shown_parts]) + (" and more" if len(parts) > shown_parts else "")


def describe(paths: list[str], facts: Facts, d: Derived, style: bool,
             tested: list[str] | None = None) -> str:
    """A subject saying what changed, when no messy commit says it: the names shortened until
    it fits in SUBJECT_MAX characters."""
    for level in range(4):
        subject = _described(paths, facts, d, style, tested, level)
        if len(subject) <= SUBJECT_MAX:
            break
    return fitted(subject)[0]


def _described(paths: list[str], facts: Facts, d: Derived, style: bool,
               tested: list[str] | None, level: int) -> str:
    group_kind = kind_of_group(paths, d)
    statuses = {d.status[p] for p in paths}
    if group_kind == "test":
        what = f"add tests for {_names(tested, level)}" if tested else \
            f"update {_names(paths, level)}"
        kind_word = "test"
    elif group_kind == "docs":
        what, kind_word = _changes(paths, facts, d, level), "docs"
    else:
        what = _changes(paths, facts, d, level)
        configs = all(d.kinds[p] == "config" for p in paths)
        kind_word = "build" if configs else "feat" if "A" in statuses else "refactor"
    return f"{kind_word}: {what}" if style else what[0].upper() + what[1:]


def message_for(paths: list[str], facts: Facts, d: Derived, style: bool,
                tested: list[str] | None = None) -> tuple[str, str]:
    """The group's message and hints. A messy subject too long for a subject is shortened, and
    the whole of it is the message's body."""
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
        if style:  # `Fix: x` is a conventional `fix: x`
            subject = TYPE.sub(lambda m: m.group(0).lower(), subject)
        if style and not CONVENTIONAL.match(subject):
            group_kind = kind_of_group(paths, d)
            prefix = {"test": "test", "docs": "docs"}.get(group_kind) or \
                ("feat" if "A" in {d.status[p] for p in paths} else "refactor")
            subject = f"{prefix}: {_cased(subject, upper=False)}"
        elif not style and not CONVENTIONAL.match(subject):  # `feat: x` keeps its case
            subject = _cased(subject, upper=True)
        subject, body = fitted(subject)
        message = f"{subject}\n\n{body}" if body else subject
    else:
        message = describe(paths, facts, d, style, tested)
    distinct = list(dict.fromkeys(sources))
    quoted = ", ".join(f"'{sanitize(s)}'" for s in distinct[:SUBJECTS_SHOWN]) + \
        (f" and {len(distinct) - SUBJECTS_SHOWN} more" if len(distinct) > SUBJECTS_SHOWN else "")
    listed = ", ".join(sanitize_name(p) for p in paths[:10]) + \
        (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    hints = (f"Take {listed} as on the source branch"
             + (f" (changed in the messy commits {quoted})" if quoted else "") + ".")
    return message, hints


