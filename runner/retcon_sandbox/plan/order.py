"""The order of the drafted commits: every file comes with or after the changed files it
imports (a test after the module it is named for), and a file stops importing a module no later
than the module's deletion; commits that need each other are merged."""

from __future__ import annotations

import heapq
import posixpath
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.kinds import kind, name_key
from retcon_sandbox.sourceimports import imports


@dataclass(frozen=True)
class Derived:
    paths: list[str]
    status: dict[str, str]
    kinds: dict[str, str]
    deps: dict[str, set[str]]  # path -> changed paths it imports at source
    stops: dict[str, set[str]]  # deleted path -> changed paths that imported it at base


def derive(facts: Facts, touched: Mapping[str, Sequence[int]] | None = None) -> Derived:
    """What orders the commits: what each file starts to need at the source (a test, the
    module it is named for and its fixtures too), and the importers of each deleted file at
    the base. `touched` (the messy commits that changed each file): a test's module or
    fixture that the messy branch had changed before the test was done is no need: the test's
    commit takes it as the branch had it then (see draft.with_versions)."""
    paths = facts.paths
    changed = set(paths)
    status = {c.path: c.status for c in facts.changes}
    deleted = {p for p, s in status.items() if s == "D"}
    present = changed - deleted
    kinds = {p: kind(p) for p in paths}
    named: dict[str, set[str]] = {}
    for p in present:
        if kinds[p] == "code":
            named.setdefault(name_key(p), set()).add(p)
    fixtures = {p for p in present if p.rsplit("/", 1)[-1] == "conftest.py"}
    base_tree = frozenset(facts.source_files | deleted)
    defined = {p: _defines(facts.base_texts.get(p), facts.texts.get(p)) for p in present}
    deps = {p: _needs(p, facts, present, base_tree, status, defined) |
            (_tested(p, named, fixtures, touched) if kinds[p] == "test" else set())
            for p in paths}
    stops: dict[str, set[str]] = {d: set() for d in deleted}
    for p, text in facts.base_texts.items():
        if p in changed:
            for d in imports(p, text, base_tree) & deleted:
                stops[d].add(p)
    return Derived(paths, status, kinds, deps, stops)


_DEFINITION = re.compile(r"^[ \t]*(?:pub(?:\([\w \t]*\))?[ \t]+|export[ \t]+(?:default[ \t]+)?|"
                         r"async[ \t]+)*"  # on the line: across lines, each would rescan
                         r"(?:def|class|fn|struct|enum|trait|type|const|static|let|var|"
                         r"function|interface|mod)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)[ \t]*[:=]",
                         re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_]\w*")
# What a module lets others import from it: `from .number import (a, clamp)` in a package's
# `__init__.py`, `__all__ = [...]`, `export { a } from`, `pub use m::{a, b}`, `pub use m::a;`.
# A list is read up to 4000 characters and never past another opening bracket, so that a
# hostile text costs linear time.
_EXPORTS = tuple(re.compile(pattern) for pattern in (
    r"\bfrom[ \t]+[\w.]+[ \t]+import[ \t]*\(([^()]{0,4000})\)",
    r"\bfrom[ \t]+[\w.]+[ \t]+import[ \t]+([\w \t,]{1,4000})",
    r"\b__all__[ \t]*\+?=[ \t]*[\[(]([^\[\]()]{0,4000})[\])]",
    r"\bexport[ \t]*\{([^{}]{0,4000})\}",
    r"\bpub[ \t]+use[ \t]+[\w:]{0,4000}\{([^{}]{0,4000})\}",
    r"\bpub[ \t]+use[ \t]+[\w:]{0,4000}::(\w+)[ \t]*;"))
_NOT_NAMES = {"as", "self", "super", "crate"}


def _exports(text: str) -> set[str]:
    return {name for pattern in _EXPORTS for listed in pattern.findall(text)
            for name in _WORD.findall(listed)} - _NOT_NAMES


def _defines(old: str | None, new: str | None) -> frozenset[str]:
    """The names a change defines: on the lines it adds, `def x`, `class X`, `fn x`, `x =`;
    and the names the module newly exports (`clamp` added to a package `__init__.py`'s imports
    or `__all__`, to `export { }`, to `pub use`): a test of `humanize.clamp` needs the
    `__init__.py` that exports it, not only `number.py`."""
    added = "\n".join((Counter((new or "").splitlines()) -
                       Counter((old or "").splitlines())).elements())
    defined = {a or b for a, b in _DEFINITION.findall(added)}
    return frozenset(defined | (_exports(new or "") - _exports(old or "")))


def _needs(p: str, facts: Facts, present: set[str], base_tree: frozenset[str],
           status: dict[str, str], defined: dict[str, frozenset[str]]) -> set[str]:
    """The changed files `p` imports at the source that it needs changed first: a new file, a
    new import, or a module whose change defines a name `p`'s change uses. An import that was
    there before, of a module `p` uses as before, orders nothing (else cycles in a package
    would merge its commits)."""
    if p not in facts.texts:
        return set()
    imported = imports(p, facts.texts[p], facts.source_files) & present
    before = imports(p, facts.base_texts[p], base_tree) if p in facts.base_texts else set()
    used = set(_WORD.findall("\n".join((Counter(facts.texts[p].splitlines()) - Counter(
        facts.base_texts.get(p, "").splitlines())).elements())))
    return {q for q in imported if status[q] == "A" or q not in before or defined[q] & used}


def _tested(test: str, named: dict[str, set[str]], fixtures: set[str],
            touched: Mapping[str, Sequence[int]] | None) -> set[str]:
    """What a test needs besides its imports: the module it is named for, and the pytest
    fixtures (`conftest.py`) of its folder and the folders above; but not one the messy branch
    was still changing around the test's last change: the test's commit takes the module's
    version of then, and its later work comes after."""
    folders = {"/".join(test.split("/")[:n]) for n in range(test.count("/") + 1)}
    wanted = named.get(name_key(test), set()) | \
        {f for f in fixtures if f != test and posixpath.dirname(f) in folders}
    if touched is None or not touched.get(test):
        return wanted
    done = max(touched[test])
    return {m for m in wanted if not touched.get(m) or not min(touched[m]) <= done
            < max(touched[m])}


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


