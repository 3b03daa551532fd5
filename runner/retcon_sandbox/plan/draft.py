"""The deterministic draft: the branch's changed files in logical commits, ordered so that
each prefix can build, with messages.

How files are grouped (plan/evidence.py reads the evidence, plan/weights.py weighs it):
- When the messy history reflects how the work went (a file changed twice, a subject that
  says something, or files committed together that are related beyond chance), each file goes
  with the files finished in the same messy commit, and consecutive pieces are joined while
  the next continues the same work: related files, a `wip` subject, no gap.
- Otherwise (files dealt out at random), files are linked by structure alone: folders, roles,
  names, imports, and the identifiers and lines their changes share; or grouped by top-level
  folder, when the pair model finds that likelier than what linking made.
- A branch of n files makes between √n / SPREAD and √n · SPREAD commits; past
  EVIDENCE_LIMIT files it is grouped by role and folder.
- A file that several pieces of work changed goes whole in the last of them; each earlier
  one takes it as its messy commits left it (`with_versions`), or with a model is drafted as a
  hints commit naming its part (`for_a_model`).
Order: by time (or, when the history has none, smaller work first), then what each file
starts to need comes first (plan/order.py). Messages: plan/messages.py.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from retcon_sandbox.paths import control_character, not_unicode
from retcon_sandbox.plan import weights
from retcon_sandbox.plan.cluster import by_folders, by_top_folder, cut, link
from retcon_sandbox.plan.evidence import (
    FEATURES,
    Structure,
    Timeline,
    features,
    structure,
    sweeps,
    timeline,
    vague,
)
from retcon_sandbox.plan.facts import Facts
from retcon_sandbox.plan.kinds import ROLES, name_key, role
from retcon_sandbox.plan.messages import (
    conventional,
    describe,
    kind_of_group,
    message_for,
    unique,
)
from retcon_sandbox.plan.order import Derived, derive, order_groups
from retcon_sandbox.text import sanitize_name

EVIDENCE_LIMIT = 300  # files; above, pairs are too many to score and folders decide
WINDOW = 3  # units on each side of a join whose files are compared (as TextTiling compares blocks)
SPREAD = 1.5  # a branch of n files makes between √n / SPREAD and √n · SPREAD commits
EMPTY_BLOBS = ("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",  # SHA-1
               "473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813")  # SHA-256


@dataclass(frozen=True)
class Group:
    paths: tuple[str, ...]
    message: str
    hints: str
    kind: str  # code | test | docs
    model: bool = False  # drafted for a model: hints only, no `paths` (see for_a_model)
    versions: tuple[tuple[str, str], ...] = ()  # files taken as a messy commit had them


@dataclass(frozen=True)
class Draft:
    groups: list[Group]
    how: str  # which evidence decided, in a few words
    shared: dict[str, tuple[int, ...]] = field(default_factory=dict)  # path -> commits (1-based)


# --- scores -------------------------------------------------------------------------------------


class Scores:
    """The pair log-odds of the structure model, computed once per pair."""

    def __init__(self, s: Structure, paths: Sequence[str]) -> None:
        w = [weights.PAIR.get(name, 0.0) for name in FEATURES]
        bias = weights.PAIR["intercept"]
        self.index = {p: i for i, p in enumerate(paths)}
        self.values: dict[tuple[int, int], float] = {}
        for i, a in enumerate(paths):
            for j in range(i + 1, len(paths)):
                self.values[i, j] = bias + sum(
                    x * f for x, f in zip(w, features(s, a, paths[j]), strict=True))

    def __call__(self, a: str, b: str) -> float:
        i, j = self.index[a], self.index[b]
        return self.values[(i, j) if i < j else (j, i)]


def coherence(facts: Facts, t: Timeline, scores: Scores) -> float:
    """How much more related the files committed together are than any two files: a z-score
    of their mean pair score (0 when no two files were committed together)."""
    values = list(scores.values.values())
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) or 1.0
    swept = sweeps(facts)
    together = {(a, b) for i, c in enumerate(facts.commits) if i not in swept
                for a in c.paths for b in c.paths
                if a < b and a in scores.index and b in scores.index}
    if not together:
        return 0.0
    shared = [scores(a, b) for a, b in together]
    return (sum(shared) / len(shared) - mean) / spread * math.sqrt(len(shared))


def ordered_history(facts: Facts, t: Timeline, scores: Scores) -> bool:
    """Whether the messy commits reflect how the work went, rather than a random deal."""
    subjects = [c.subject for c in facts.commits]
    telling = sum(not vague(s) for s in subjects)
    return t.revisited > 0 or 10 * telling >= len(subjects) > 0 or \
        coherence(facts, t, scores) >= 1.0


def goes_on_features(facts: Facts, t: Timeline, scores: Scores) -> list[dict[str, float]]:
    """What says whether the next unit of the timeline continues this one's work: how related
    their files are (and those of the units around the join), whether their subjects say
    anything, the gap between them, their sizes, and how finely the branch was committed."""
    granularity = math.log(len(facts.commits) / len(facts.paths))
    out = []
    for i in range(len(t.units) - 1):
        here, there = t.unit_commits[i], t.unit_commits[i + 1]
        pairs = [scores(a, b) for a in t.units[i] for b in t.units[i + 1]]
        before = [p for u in t.units[max(0, i - WINDOW + 1):i + 1] for p in u]
        after = [p for u in t.units[i + 1:i + 1 + WINDOW] for p in u]
        window = [scores(a, b) for a in before for b in after]
        out.append({"mean score": sum(pairs) / len(pairs), "best score": max(pairs),
                    "window score": sum(window) / len(window),
                    "next says nothing": float(there >= len(facts.commits) or
                                               vague(facts.commits[there].subject)),
                    "this says nothing": float(vague(facts.commits[here].subject)),
                    "gap": math.log(max(1, there - here)),
                    "this size": math.log(len(t.units[i])),
                    "next size": math.log(len(t.units[i + 1])), "granularity": granularity})
    return out


def goes_on(facts: Facts, t: Timeline, scores: Scores) -> list[float]:
    """For each unit of the timeline but the last: the chance that the next continues it."""
    w = weights.GOES_ON
    out = []
    for x in goes_on_features(facts, t, scores):
        logit = w["intercept"] + sum(w.get(k, 0.0) * v for k, v in x.items())
        out.append(1 / (1 + math.exp(-max(-50.0, min(50.0, logit)))))
    return out


# --- grouping -----------------------------------------------------------------------------------


def _renames(facts: Facts, groups: list[list[str]]) -> list[list[str]]:
    """A deleted file goes with the one added file that has its content (not an empty file:
    every empty file has the same content)."""
    added: dict[str, list[str]] = {}
    for c in facts.changes:
        if c.status == "A" and c.new_blob and c.new_blob not in EMPTY_BLOBS:
            added.setdefault(c.new_blob, []).append(c.path)
    home = {p: i for i, g in enumerate(groups) for p in g}
    for c in facts.changes:
        if c.status == "D" and c.old_blob and len(added.get(c.old_blob, ())) == 1:
            new = added[c.old_blob][0]
            if home[new] != home[c.path]:
                groups[home[c.path]].remove(c.path)
                groups[home[new]].append(c.path)
                home[c.path] = home[new]
    return [g for g in groups if g]


@dataclass(frozen=True)
class Grouping:
    groups: list[list[str]]
    ranks: list[float]  # lower first
    how: str
    timeline: Timeline | None = None  # when the history's order made the groups


def group_files(facts: Facts) -> Grouping:
    paths = facts.paths
    if len(paths) > EVIDENCE_LIMIT:
        roles = {p: role(p) for p in paths}
        groups = by_folders(paths, roles, max(3, min(20, round(math.sqrt(len(paths))))))
        return Grouping(groups, _role_ranks(groups, roles, paths),
                        f"{len(paths)} files: by role and folder (the evidence is weighed up "
                        f"to {EVIDENCE_LIMIT} files)")
    s, t = structure(facts), timeline(facts)
    scores = Scores(s, paths)
    root = math.sqrt(len(paths))
    fewest, most = max(1, round(root / SPREAD)), max(1, round(root * SPREAD))
    if len(t.units) > 1 and ordered_history(facts, t, scores):
        groups = _renames(facts, cut(t.units, goes_on(facts, t, scores), fewest, most))
        return Grouping(groups, [float(i) for i in range(len(groups))],
                        "the messy history's order, then structure", t)
    groups = _renames(facts, link(paths, scores, weights.LINK, fewest, most))
    how = "structure: folders, roles, names, imports and shared identifiers"
    folders = _renames(facts, by_top_folder(paths))
    if fewest <= len(folders) <= most and likelihood(folders, scores) > likelihood(groups, scores):
        groups, how = folders, ("structure, which says no more than the top-level folders: "
                                "one commit per folder")
    return Grouping(groups, _size_ranks(groups, s), f"{how}; ordered smaller work first")


def likelihood(groups: Sequence[Sequence[str]], scores: Scores) -> float:
    """How much likelier the pair model finds this grouping than every file alone: the sum of
    the log-odds of the pairs it puts together. Linking is greedy; where its evidence is weak,
    plain top-level folders can explain the scores better, and then they are the draft."""
    return sum(scores(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1:])


def _size_ranks(groups: list[list[str]], s: Structure) -> list[float]:
    """Without an order in the history, smaller work first: a group's rank is the mean of
    log(1 + lines changed) of its files. A file that kept changing through the branch has the
    most changed lines and was finished last; preparatory changes are small. (Order agreement
    on bench/plan.py's shuffled branches: 0.45 by role, 0.60 by size; 0.41 and 0.55 on the
    projects the weights never saw; bench/plan_signals.py.)"""
    return [sum(math.log1p(s.sizes[p]) for p in g) / len(g) for g in groups]


def _role_ranks(groups: list[list[str]], roles: dict[str, str], paths: Sequence[str]
                ) -> list[float]:
    """Configuration and dependencies first, then code, tests, docs and change logs; then by
    the order of the diff."""
    index = {p: i for i, p in enumerate(paths)}
    return [min(ROLES.index(roles[p]) for p in g) * len(paths) + min(index[p] for p in g)
            for g in groups]


def shared_files(t: Timeline, groups: Sequence[Sequence[str]]
                 ) -> dict[str, dict[int, tuple[int, ...]]]:
    """Files that messy commits of two or more drafted commits changed: path -> each of those
    commits (1-based) -> the messy commits (indices) that changed the file for it. A messy
    commit belongs to the drafted commit of the next files finished (it or a later one did the
    work). The file goes whole in the last, its own."""
    home = {p: i for i, g in enumerate(groups) for p in g}
    out: dict[str, dict[int, tuple[int, ...]]] = {}
    for p, commits in t.touched.items():
        parts: dict[int, list[int]] = {}
        for c in commits:
            after = bisect.bisect_left(t.unit_commits, c)
            if after < len(t.units):
                g = home[t.units[after][0]]
                if g <= home[p]:
                    parts.setdefault(g + 1, []).append(c)
        if len(parts) > 1:
            out[p] = {g: tuple(sorted(set(c))) for g, c in sorted(parts.items())}
    return out


def shared_by(facts: Facts, groups: Sequence[Sequence[str]]
              ) -> dict[str, dict[int, tuple[int, ...]]]:
    """shared_files for any grouping of the branch (the draft's, or a model's), when its
    history has an order to read; else none."""
    if len(facts.paths) > EVIDENCE_LIMIT:
        return {}
    t = timeline(facts)
    if len(t.units) < 2 or not ordered_history(facts, t, Scores(structure(facts), facts.paths)):
        return {}
    return shared_files(t, groups)


def with_versions(groups: Sequence[Group], shared: dict[str, dict[int, tuple[int, ...]]],
                  facts: Facts) -> list[Group]:
    """The groups with each commit that has part of a shared file taking that file as the
    last messy commit of its part left it (`versions`), so that its build and tests see the
    work so far, as the messy branch did; the last commit takes the file whole."""
    taken: dict[int, list[tuple[str, str]]] = {}
    for path, commits in shared.items():
        if control_character(path) or not_unicode(path, names=True):
            continue  # a `versions` key names a file exactly
        for number, messy in list(commits.items())[:-1]:
            sha = facts.commits[max(messy)].sha
            if sha:
                taken.setdefault(number, []).append((path, sha))
    return [replace(g, versions=tuple(taken[n])) if n in taken else g
            for n, g in enumerate(groups, 1)]


def for_a_model(groups: Sequence[Group], shared: dict[str, dict[int, tuple[int, ...]]],
                hunks: dict[tuple[str, int], str]) -> list[Group]:
    """The groups with each commit that has part of a shared file drafted as a hints commit
    (no `paths`): its hints name its files, and that file's hunks (`hunks`: (path, commit) ->
    the diff of that part), for a model to extract; the last commit keeps the file whole."""
    parts: dict[int, list[str]] = {}
    for path, commits in shared.items():
        for number in list(commits)[:-1]:
            parts.setdefault(number, []).append(path)
    out = []
    for number, group in enumerate(groups, 1):
        if number not in parts:
            out.append(group)
            continue
        extra = " ".join(f"From {sanitize_name(p)}, take only this part of its change (the "
                         f"rest goes in a later commit):\n{hunks.get((p, number), '')}"
                         for p in parts[number])
        whole = [sanitize_name(p) for p in group.paths if p not in parts[number]]
        named = group.hints or (f"Take whole: {', '.join(whole)}." if whole else "")
        out.append(Group(group.paths, group.message, f"{named}\n{extra}".strip(), group.kind,
                         model=True))
    return out


def draft(facts: Facts) -> Draft:
    """The deterministic plan: file-exact groups, ordered, with messages."""
    grouping = group_files(facts)
    d = derive(facts, grouping.timeline.touched if grouping.timeline else None)
    if grouping.timeline is None:
        grouping = with_their_tests(grouping, d)
    ordered = order_groups(grouping.groups, grouping.ranks, d)
    index = {p: i for i, p in enumerate(d.paths)}
    ordered = [sorted(g, key=index.__getitem__) for g in ordered if g]
    shared = shared_files(grouping.timeline, ordered) if grouping.timeline else {}
    return Draft(_messages(facts, d, ordered), grouping.how,
                 {p: tuple(commits) for p, commits in shared.items()})


def with_their_tests(grouping: Grouping, d: Derived) -> Grouping:
    """A changed test goes with the changed module it is named for: apart, the prefix between
    them runs the old test on the new module, or the new test on the old one. Only where
    structure made the groups: a history's order already says which came first."""
    home = {p: i for i, g in enumerate(grouping.groups) for p in g}
    modules: dict[str, int] = {}
    for p in d.paths:
        if d.kinds[p] == "code" and d.status[p] == "M":
            modules.setdefault(name_key(p), home[p])
    groups = [list(g) for g in grouping.groups]
    for p in d.paths:
        to = modules.get(name_key(p))
        if d.kinds[p] == "test" and d.status[p] == "M" and to is not None and to != home[p]:
            groups[home[p]].remove(p)
            groups[to].append(p)
    kept = [i for i, g in enumerate(groups) if g]
    return replace(grouping, groups=[groups[i] for i in kept],
                   ranks=[grouping.ranks[i] for i in kept])


def _messages(facts: Facts, d: Derived, groups: list[list[str]]) -> list[Group]:
    style = conventional(facts.log_subjects if len(facts.log_subjects) >= 3
                         else (*facts.log_subjects, *(c.subject for c in facts.commits)))
    where = {p: i for i, g in enumerate(groups) for p in g}
    out: list[Group] = []
    subjects: set[str] = set()
    for group in groups:
        needed = {where[q] for t in group for q in d.deps.get(t, ()) if q in where} - \
            {where[group[0]]}
        tested = [q for q in d.paths if needed and where.get(q) == max(needed) and
                  any(q in d.deps.get(t, ()) for t in group)]
        message, hints = message_for(group, facts, d, style, tested)
        if message.split("\n", 1)[0] in subjects:  # an earlier commit has these words: say
            message = describe(group, facts, d, style)  # what this one changes: its files
        message = unique(message, subjects)
        subjects.add(message.split("\n", 1)[0])
        out.append(Group(tuple(group), message, hints, kind_of_group(group, d)))
    return out
