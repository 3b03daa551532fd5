"""What the messy branch says about which changed files belong together: read once, as plain
values, for the draft (plan/draft.py) and for the benchmark that fits its weights.

Two kinds of evidence:
- **Structure**, which any branch has: folders, roles (plan/kinds.py), names (`cart.py`,
  `test_cart.py`, `cart.rst`), imports either way, the identifiers and lines the changes
  share (the name flows of Flexeme), whether files were added or deleted together.
- **Time**, which the messy commits give: each file's last commit that counts (a sweeping
  commit such as a formatter run does not; a `fixup! X` counts as X), and so the files that
  were finished together.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.kinds import name_key, role
from retcon_sandbox.plan.messages import useful
from retcon_sandbox.sourceimports import imports

FORMATTING = re.compile(r"\b(format(ting|ted)?|fmt|black|prettier|rustfmt|isort|ruff|lint|"
                        r"autopep8|yapf|style|whitespace)\b", re.IGNORECASE)
FIXUP = re.compile(r"^(fixup|squash|amend)! +(.*)$", re.DOTALL)
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}|\d+(?:\.\d+)+")
SIGNS = re.compile(r"\w+|[^\w\s\"'`,;()\[\]{}\\]")  # words, and what a formatter keeps
LINE_MIN = 8  # shorter changed lines (`}`, `return x`) say nothing of where they came from


# --- time -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    last: dict[str, int]  # path -> the messy commit that finished it (an index of facts.commits)
    touched: dict[str, tuple[int, ...]]  # path -> the commits that count that changed it
    units: list[list[str]]  # the files each such commit finished, oldest first
    unit_commits: list[int]  # the commit of each unit
    revisited: int  # files that two commits that count changed


def sweeps(facts: Facts) -> set[int]:
    """The messy commits that sweep across a branch: 3 or more of its files under a formatter's
    or linter's subject, or 3 or more files that the commit only laid out anew, whatever its
    subject (`layout_only`). How large a commit is says nothing: a real piece of work can
    touch most of a branch's files."""
    changed = set(facts.paths)
    return {i for i, commit in enumerate(facts.commits)
            if len(changed.intersection(commit.paths)) >= 3 and
            (commit.layout or FORMATTING.search(commit.subject))}


def layout_only(old: str, new: str) -> bool:
    """Whether a change only lays a file out anew, as a formatter or an import sorter does:
    its words and operators in the same order (what changed is whitespace, quotes, commas,
    semicolons, brackets), or its lines the same but moved. `a - b` to `b - a`, `1` to `-1`
    and `<` to `<=` are changes; re-indenting a Python block is not told apart."""
    if old == new:
        return False
    if SIGNS.findall(old) == SIGNS.findall(new):
        return True
    return _lines(old) == _lines(new)


def _lines(text: str) -> Counter[str]:
    """A text's lines that hold anything, each with its runs of whitespace as one space."""
    return Counter(" ".join(line.split()) for line in text.splitlines() if line.strip())


def _fixup_targets(facts: Facts) -> dict[int, int]:
    """`fixup! X` (squash!, amend!) -> the latest earlier commit whose subject is X."""
    out: dict[int, int] = {}
    for i, commit in enumerate(facts.commits):
        match = FIXUP.match(commit.subject.strip())
        if match:
            target = match.group(2).strip()
            earlier = [j for j in range(i) if facts.commits[j].subject.strip() == target]
            if earlier:
                out[i] = out.get(earlier[-1], earlier[-1])
    return out


def timeline(facts: Facts) -> Timeline:
    """Each file's last commit that counts: a sweep does not count; `fixup! X` counts as X."""
    changed = set(facts.paths)
    swept, fixed = sweeps(facts), _fixup_targets(facts)
    last: dict[str, int] = {}
    touched: dict[str, list[int]] = {}
    for i, commit in enumerate(facts.commits):
        files = [p for p in commit.paths if p in changed]  # in the commit's order: a set's
        if i in swept or not files:  # order changes with the hash seed, and the spec with it
            continue
        for p in files:
            touched.setdefault(p, []).append(fixed.get(i, i))
            last[p] = max(last.get(p, -1), fixed.get(i, i))
    for i in sorted(swept):  # files only a sweep touched: done when it was
        for p in facts.commits[i].paths:
            if p in changed:
                last.setdefault(p, i)
    by_commit: dict[int, list[str]] = {}
    for p in facts.paths:
        by_commit.setdefault(last.get(p, len(facts.commits)), []).append(p)
    order = sorted(by_commit)
    return Timeline(last, {p: tuple(sorted(set(c))) for p, c in touched.items()},
                    [by_commit[k] for k in order], order,
                    sum(1 for c in touched.values() if len(set(c)) > 1))


def vague(subject: str) -> bool:
    """A subject that says nothing of what its commit is for (`wip`, `fix build`, a fixup)."""
    return useful(subject) is None or bool(FIXUP.match(subject.strip()))


# --- structure --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Structure:
    roles: dict[str, str]
    keys: dict[str, str]
    status: dict[str, str]
    links: dict[str, frozenset[str]]  # changed files it imports or is imported by
    tokens: dict[str, dict[str, float]]  # unit TF-IDF vector of the changed lines' identifiers
    lines: dict[str, frozenset[str]]  # its changed lines, stripped, of LINE_MIN or more
    sizes: dict[str, int]  # how many lines it adds or removes (0 for a file not read as text)


def changed_lines(old: str | None, new: str | None) -> list[str]:
    """The lines one side has more often than the other (order ignored: linear, and enough to
    say which names a change touches)."""
    before, after = Counter((old or "").splitlines()), Counter((new or "").splitlines())
    return list((after - before).elements()) + list((before - after).elements())


def _links(facts: Facts) -> dict[str, frozenset[str]]:
    changed = set(facts.paths)
    deleted = {c.path for c in facts.changes if c.status == "D"}
    base_tree = frozenset(facts.source_files | deleted)
    out: dict[str, set[str]] = {p: set() for p in facts.paths}
    for texts, tree in ((facts.texts, facts.source_files), (facts.base_texts, base_tree)):
        for p, text in texts.items():
            if p in out:
                for q in imports(p, text, tree) & changed:
                    out[p].add(q)
                    out[q].add(p)
    return {p: frozenset(q) for p, q in out.items()}


def _tokens(paths: Sequence[str], changed: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    counts = {p: Counter(t for line in changed[p] for t in set(TOKEN.findall(line)))
              for p in paths}
    df: Counter[str] = Counter()
    for c in counts.values():
        df.update(c.keys())
    n = len(paths)
    out = {}
    for p, c in counts.items():
        vector = {t: (1 + math.log(k)) * math.log(n / df[t]) for t, k in c.items()
                  if 1 < df[t] < n}
        norm = math.sqrt(sum(x * x for x in vector.values())) or 1.0
        out[p] = {t: x / norm for t, x in sorted(vector.items())}
    return out


def structure(facts: Facts) -> Structure:
    texts, base = facts.texts, facts.base_texts
    changed = {p: changed_lines(base.get(p), texts.get(p)) for p in facts.paths}
    lines = {p: frozenset(s for line in changed[p] if len(s := line.strip()) >= LINE_MIN)
             for p in facts.paths}
    return Structure({p: role(p) for p in facts.paths}, {p: name_key(p) for p in facts.paths},
                     {c.path: c.status for c in facts.changes}, _links(facts),
                     _tokens(facts.paths, changed), lines,
                     {p: len(changed[p]) for p in facts.paths})


# --- one pair's features, in the order of FEATURES ----------------------------------------------

PAIRED_ROLES = ("ci", "docs", "changelog", "deps", "config", "test", "code")
MIXED_ROLES = (("code", "test"), ("code", "docs"), ("code", "changelog"))
FEATURES = ("same folder", "same top folder", "same role", *(f"both {r}" for r in PAIRED_ROLES),
            *(f"{a} and {b}" for a, b in MIXED_ROLES), "same name", "import",
            "shared identifiers", "shared lines", "both added", "both deleted",
            "added and not")


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def top_folder(path: str) -> str:
    """The path's top-level folder ("" at the root): the pair model's "same top folder", and
    the draft's fallback grouping (cluster.by_top_folder)."""
    return path.split("/", 1)[0] if "/" in path else ""


def cosine(a: dict[str, float], b: dict[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(x * b.get(t, 0.0) for t, x in a.items())


def features(s: Structure, a: str, b: str) -> tuple[float, ...]:
    ra, rb = s.roles[a], s.roles[b]
    la, lb = s.lines[a], s.lines[b]
    sa, sb = s.status[a], s.status[b]
    return (float(_folder(a) == _folder(b)), float(top_folder(a) == top_folder(b)), float(ra == rb),
            *(float(ra == rb == r) for r in PAIRED_ROLES),
            *(float({ra, rb} == {x, y}) for x, y in MIXED_ROLES),
            float(s.keys[a] == s.keys[b] and len(s.keys[a]) > 1), float(b in s.links[a]),
            cosine(s.tokens[a], s.tokens[b]),
            len(la & lb) / min(len(la), len(lb)) if la and lb else 0.0,
            float(sa == sb == "A"), float(sa == sb == "D"), float((sa == "A") != (sb == "A")))
