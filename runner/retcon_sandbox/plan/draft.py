"""The deterministic draft: group the branch's changed files into logical commits, and order the
groups so that each prefix can build.

- Files that the messy commits changed together (Jaccard similarity of the sets of commits that
  touched them at least 1/2) are one group; a commit that sweeps over most of a larger branch
  says nothing and is not counted. A rename (a deleted and an added file with the same content
  or name) is one group.
- A code file changed on its own joins the group of a new module it starts importing, or of the
  file whose deletion it follows. Files that no messy commit tells apart (only a sweeping one
  touched them) are grouped by directory. A manifest joins the group it changed with most, else
  the first.
- A test file changed in the same messy commits as some code goes with that code; otherwise the
  tests of one group's code come right after it, as their own commit. Documentation changed only
  alongside one group's code goes with it; the rest is one last commit.
- Order: groups by when the messy branch first touched them, then every import is honoured (a
  file comes with or after every changed file it imports, and a file stops importing a module no
  later than the module's deletion); groups that need each other are merged.
Messages come from the messy commits where one describes its group; else they say what changed,
in the repository's style (conventional commits when its log uses them).
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.kinds import kind, test_file
from retcon_sandbox.sourceimports import imports
from retcon_sandbox.text import sanitize, sanitize_name

JACCARD = 0.5
SWEEP = 0.5  # a commit touching more than this share of a branch's files (of 7 or more) sweeps


@dataclass(frozen=True)
class Group:
    paths: tuple[str, ...]
    message: str
    hints: str
    kind: str  # code | test | docs


class _Sets:
    """Union-find over paths; the representative of a set is its first path in diff order."""

    def __init__(self, items: Iterable[str]) -> None:
        self.order = {p: i for i, p in enumerate(items)}
        self.parent = {p: p for p in self.order}

    def find(self, p: str) -> str:
        while self.parent[p] != p:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        return p

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            first, second = sorted((ra, rb), key=self.order.__getitem__)
            self.parent[second] = first

    def members(self, items: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in items:
            out.setdefault(self.find(p), []).append(p)
        return out


# --- facts derived once ------------------------------------------------------------------


@dataclass(frozen=True)
class Derived:
    paths: list[str]
    status: dict[str, str]
    kinds: dict[str, str]
    touch: dict[str, frozenset[int]]  # path -> indices of the messy commits that count
    deps: dict[str, set[str]]  # path -> changed paths it imports at source
    stops: dict[str, set[str]]  # deleted path -> changed paths that imported it at base
    by_commit: dict[int, tuple[str, ...]]  # messy commit that counts -> the paths it touched


def derive(facts: Facts) -> Derived:
    paths = facts.paths
    changed = set(paths)
    status = {c.path: c.status for c in facts.changes}
    touch: dict[str, set[int]] = {p: set() for p in paths}
    for i, commit in enumerate(facts.commits):
        touched = changed.intersection(commit.paths)
        if len(changed) >= 7 and len(touched) > SWEEP * len(changed):
            continue
        for p in touched:
            touch[p].add(i)
    present = changed - {p for p, s in status.items() if s == "D"}
    deps = {p: imports(p, facts.texts[p], facts.source_files) & present if p in facts.texts
            else set() for p in paths}
    deleted = {p for p, s in status.items() if s == "D"}
    base_tree = frozenset(facts.source_files | deleted)
    stops: dict[str, set[str]] = {d: set() for d in deleted}
    for p, text in facts.base_texts.items():
        if p in changed:
            for d in imports(p, text, base_tree) & deleted:
                if p not in deps or d not in deps[p]:
                    stops[d].add(p)
    by_commit: dict[int, list[str]] = {}
    for p in paths:
        for i in sorted(touch[p]):
            by_commit.setdefault(i, []).append(p)
    return Derived(paths, status, {p: kind(p) for p in paths},
                   {p: frozenset(s) for p, s in touch.items()}, deps, stops,
                   {i: tuple(ps) for i, ps in by_commit.items()})


def _jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


# --- grouping --------------------------------------------------------------------------------


EMPTY_BLOBS = ("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",  # SHA-1
               "473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813")  # SHA-256


def _renames(facts: Facts, sets: _Sets) -> None:
    """A deleted file and the one added file with its content (else its name) are one change.
    Not an empty file: every empty file has the same content, and its name (`__init__.py`)
    says nothing of where it went, as git's own rename detection holds."""
    added = [c for c in facts.changes if c.status == "A" and c.new_blob not in EMPTY_BLOBS]
    for gone in (c for c in facts.changes if c.status == "D" and c.old_blob not in EMPTY_BLOBS):
        same = [a for a in added if a.new_blob and a.new_blob == gone.old_blob] or \
            [a for a in added if a.path.rsplit("/", 1)[-1] == gone.path.rsplit("/", 1)[-1]]
        if len(same) == 1:
            sets.union(gone.path, same[0].path)


def _by_cochange(files: list[str], d: Derived, sets: _Sets) -> None:
    """Union the files whose messy commits overlap enough; only pairs that share a commit are
    compared, once per distinct set of commits."""
    first: dict[frozenset[int], str] = {}
    for p in files:
        if d.touch[p]:
            if d.touch[p] in first:
                sets.union(first[d.touch[p]], p)
            else:
                first[d.touch[p]] = p
    shown = set(first.values())
    compared: set[tuple[str, str]] = set()
    for touched in d.by_commit.values():
        local = [p for p in touched if p in shown]
        for i, a in enumerate(local):
            for b in local[i + 1:]:
                if (a, b) not in compared:
                    compared.add((a, b))
                    if _jaccard(d.touch[a], d.touch[b]) >= JACCARD:
                        sets.union(a, b)


def _lone(files: list[str], sets: _Sets) -> list[str]:
    sizes = Counter(sets.find(p) for p in files)
    return [p for p in files if sizes[sets.find(p)] == 1]


def _attach_code(code: list[str], d: Derived, sets: _Sets) -> None:
    for p in _lone([q for q in code if d.kinds[q] == "code" and d.status[q] == "M"], sets):
        new = [q for q in d.deps[p] if d.status[q] == "A" and q in code]
        followed = [d_ for d_, importers in d.stops.items() if p in importers and d_ in code]
        for other in new + followed:
            if sets.find(other) != sets.find(p):
                sets.union(p, other)
                break
    for p in _lone(code, sets):  # a lone deletion follows the first file that stopped using it
        if d.status[p] == "D":
            for importer in sorted(d.stops[p], key=sets.order.__getitem__):
                if importer in code:
                    sets.union(p, importer)
                    break
    by_dir: dict[str, str] = {}  # files no messy commit tells apart: by directory
    for p in _lone([q for q in code if d.kinds[q] == "code" and not d.touch[q]], sets):
        directory = p.rsplit("/", 1)[0] if "/" in p else ""
        if directory in by_dir:
            sets.union(by_dir[directory], p)
        else:
            by_dir[directory] = p


def _overlap(p: str, candidates: list[str], d: Derived, sets: _Sets) -> str | None:
    """The group (of `candidates`' files) that shares most messy commits with `p`."""
    allowed = set(candidates)
    counts: Counter[str] = Counter()
    for i in d.touch[p]:
        for q in d.by_commit[i]:
            if q in allowed and sets.find(q) != sets.find(p):
                counts[sets.find(q)] += 1
    best = [g for g, n in counts.items() if n and n == max(counts.values())]
    return min(best, key=sets.order.__getitem__) if best else None


def _first_touch(files: Iterable[str], d: Derived) -> float:
    firsts = [min(d.touch[p]) for p in files if d.touch[p]]
    return float(min(firsts)) if firsts else 1e6


def _support_first(groups: list[list[str]], ranks: list[float], loose: list[str]) -> None:
    """Files that support tests and import no changed code (`conftest.py`, fixtures, data
    under `tests/`) go with the first group holding tests, not last: tests need them."""
    support = [p for p in loose if not test_file(p)]
    holding = [i for i, g in enumerate(groups) if any(test_file(p) for p in g)]
    if not support or not holding:
        return
    first = min(holding, key=lambda i: ranks[i])
    groups[first].extend(support)
    loose[:] = [p for p in loose if p not in support]


def order_groups(groups: list[list[str]], ranks: list[float], d: Derived) -> list[list[str]]:
    """The groups in an order where every file comes with or after what it imports (and a
    deletion with or after its importers' changes), closest to `ranks` (lower first); groups
    that need each other are merged."""
    where = {p: i for i, g in enumerate(groups) for p in g}
    after: dict[int, set[int]] = {i: set() for i in range(len(groups))}  # i needs these first
    for i, group in enumerate(groups):
        for p in group:
            wanted = set(d.deps.get(p, ())) | d.stops.get(p, set())
            after[i] |= {where[q] for q in wanted if q in where and where[q] != i}
    components = _strongly_connected(after)
    comp_of = {i: c for c, members in enumerate(components) for i in members}
    merged = [[p for i in sorted(members) for p in groups[i]] for members in components]
    rank = [min(ranks[i] for i in members) for members in components]
    needs: dict[int, set[int]] = {c: set() for c in range(len(components))}
    for i, firsts in after.items():
        needs[comp_of[i]] |= {comp_of[j] for j in firsts if comp_of[j] != comp_of[i]}
    waiting = {c: len(firsts) for c, firsts in needs.items()}
    unblocks: dict[int, list[int]] = {c: [] for c in needs}
    for c, firsts in needs.items():
        for first in firsts:
            unblocks[first].append(c)
    ready = [(rank[c], c) for c, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    done: list[int] = []
    while ready:
        _, chosen = heapq.heappop(ready)
        done.append(chosen)
        for c in unblocks[chosen]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (rank[c], c))
    return [merged[c] for c in done]


def _strongly_connected(graph: dict[int, set[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iteratively; components in no particular order."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    out: list[list[int]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    out.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def group_files(facts: Facts) -> list[list[str]]:
    """The draft's groups of paths, in order."""
    d = derive(facts)
    sets = _Sets(d.paths)
    _renames(facts, sets)
    code = [p for p in d.paths if d.kinds[p] in ("code", "config")]
    _by_cochange(code, d, sets)
    _attach_code(code, d, sets)
    first_config: list[str] = []
    for p in _lone([q for q in code if d.kinds[q] == "config"], sets):
        best = _overlap(p, [q for q in code if d.kinds[q] == "code"], d, sets)
        if best is not None:
            sets.union(best, p)
        else:
            first_config.append(p)
    code_groups = [g for g in sets.members(code).values()]
    ranked = [(-1.0 if all(p in first_config for p in g) else _first_touch(g, d)) for g in
              code_groups]
    code_order = order_groups(code_groups, ranked, d)
    position = {p: i for i, g in enumerate(code_order) for p in g}
    groups: list[list[str]] = [list(g) for g in code_order]
    ranks: list[float] = [float(i) for i in range(len(groups))]

    tests = [p for p in d.paths if d.kinds[p] == "test" and p not in position]
    later: dict[int, list[str]] = {}  # tests of group i's code, committed after it
    loose: list[str] = []
    for t in tests:
        best = _overlap(t, [q for q in code if q in position], d, sets)
        if best is not None:
            groups[position[best]].append(t)
            continue
        targets = [position[q] for q in d.deps[t] if q in position]
        if targets:
            later.setdefault(max(targets), []).append(t)
        else:
            loose.append(t)
    for i, files in sorted(later.items()):
        groups.append(files)
        ranks.append(i + 0.5)
    _support_first(groups, ranks, loose)
    if loose:
        groups.append(loose)
        ranks.append(1e6)

    docs = [p for p in d.paths if d.kinds[p] == "docs" and p not in position]
    rest: list[str] = []
    for p in docs:
        homes = {position[q] for i in d.touch[p] for q in d.by_commit[i] if q in position}
        only = all(any(q in position for q in d.by_commit[i]) for i in d.touch[p])
        if len(homes) == 1 and only and d.touch[p]:
            groups[homes.pop()].append(p)
        else:
            rest.append(p)
    if rest:
        groups.append(rest)
        ranks.append(2e6)
    ordered = order_groups(groups, ranks, d)
    index = {p: i for i, p in enumerate(d.paths)}
    return [sorted(g, key=index.__getitem__) for g in ordered if g]


# --- messages --------------------------------------------------------------------------------

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


def _useful(subject: str) -> str | None:
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


def _kind_of_group(paths: list[str], d: Derived) -> str:
    kinds = {d.kinds[p] for p in paths}
    if kinds <= {"test"}:
        return "test"
    if kinds <= {"docs"}:
        return "docs"
    return "code"


def _changes(paths: list[str], facts: Facts, d: Derived) -> str:
    """`rename a to b; add c; update d`, leaving out the tests that come along."""
    shown = [p for p in paths if d.kinds[p] != "test"] or paths
    blobs = {c.path: (c.old_blob, c.new_blob) for c in facts.changes if c.path in shown}
    parts: list[str] = []
    renamed: set[str] = set()
    for gone in (p for p in shown if d.status[p] == "D"):
        for new in (p for p in shown if d.status[p] == "A" and p not in renamed):
            if blobs[new][1] == blobs[gone][0] or new.rsplit("/", 1)[-1] == \
                    gone.rsplit("/", 1)[-1]:
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
    group_kind = _kind_of_group(paths, d)
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
    members = set(paths)
    scored: list[tuple[int, int, str]] = []
    sources: list[str] = []
    for i, commit in enumerate(facts.commits):
        inside = members.intersection(commit.paths)
        if not inside:
            continue
        sources.append(commit.subject)
        useful = _useful(commit.subject)
        if useful and 2 * len(inside) >= len(set(commit.paths) & set(d.paths)):
            scored.append((-len(inside), i, useful))
    if scored:
        subject = min(scored)[2]
        if style and not CONVENTIONAL.match(subject):
            group_kind = _kind_of_group(paths, d)
            prefix = {"test": "test", "docs": "docs"}.get(group_kind) or \
                ("feat" if "A" in {d.status[p] for p in paths} else "refactor")
            subject = f"{prefix}: {subject[0].lower()}{subject[1:]}"
        elif not style and not CONVENTIONAL.match(subject):  # `feat: x` keeps its case
            subject = subject[0].upper() + subject[1:]
    else:
        subject = describe(paths, facts, d, style, tested)
    quoted = ", ".join(f"'{sanitize(s)}'" for s in dict.fromkeys(sources))
    listed = ", ".join(sanitize_name(p) for p in paths[:10]) + \
        (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    hints = (f"Take {listed} as on the source branch"
             + (f" (changed in the messy commits {quoted})" if quoted else "") + ".")
    return subject, hints


def draft(facts: Facts) -> list[Group]:
    """The deterministic plan: file-exact groups, ordered, with messages."""
    d = derive(facts)
    groups = group_files(facts)
    style = conventional(facts.log_subjects if len(facts.log_subjects) >= 3
                         else (*facts.log_subjects, *(c.subject for c in facts.commits)))
    where = {p: i for i, g in enumerate(groups) for p in g}
    out: list[Group] = []
    for group in groups:
        needed = {where[q] for t in group for q in d.deps.get(t, ()) if q in where} - \
            {where[group[0]]}
        tested = [q for q in d.paths if needed and where.get(q) == max(needed) and
                  any(q in d.deps.get(t, ()) for t in group)]
        message, hints = message_for(group, facts, d, style, tested)
        out.append(Group(tuple(group), message, hints, _kind_of_group(group, d)))
    return out
