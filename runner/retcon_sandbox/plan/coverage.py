"""Coverage: every changed file in exactly one commit. Checked for a spec (`plan --check`) and
enforced on a model's proposal (repaired, or refused)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from retcon_sandbox.paths import Patterns
from retcon_sandbox.plan.draft import Group
from retcon_sandbox.plan.order import Derived, order_groups
from retcon_sandbox.text import sanitize


@dataclass(frozen=True)
class Coverage:
    by_model: tuple[int, ...]  # hints-only commits: the model decides what they take
    uncovered: tuple[str, ...]  # matched by no `paths` (left to the model, if any)
    twice: dict[str, tuple[int, ...]]  # matched by two or more commits' `paths`
    unmatched: dict[int, tuple[str, ...]]  # patterns that match no changed file, by commit

    @property
    def complete(self) -> bool:
        return not self.twice and not self.unmatched and (not self.uncovered or
                                                          bool(self.by_model))


def check(paths: Sequence[str], commits: Sequence[tuple[int, tuple[str, ...] | None]]
          ) -> Coverage:
    """Which commits' `paths` match each changed file; `commits` are (number, paths or None)."""
    owners: dict[str, list[int]] = {p: [] for p in paths}
    unmatched: dict[int, tuple[str, ...]] = {}
    for number, items in commits:
        if items is None:
            continue
        patterns = Patterns(items)
        for p in paths:
            if patterns.matches(p):
                owners[p].append(number)
        missing = patterns.unmatched(paths)
        if missing:
            unmatched[number] = tuple(missing)
    return Coverage(tuple(n for n, items in commits if items is None),
                    tuple(p for p, o in owners.items() if not o),
                    {p: tuple(o) for p, o in owners.items() if len(o) > 1}, unmatched)


# --- a model's proposal ----------------------------------------------------------------------


@dataclass(frozen=True)
class Proposed:
    message: str
    paths: tuple[str, ...]
    hints: str = ""


@dataclass
class Repairs:
    repeated: dict[str, int] = field(default_factory=dict)  # path -> the commit that kept it
    unknown: list[str] = field(default_factory=list)  # paths not in the diff, dropped
    missed: dict[str, int] = field(default_factory=dict)  # path -> the commit it went to
    refused: str | None = None  # why the proposal was not used at all

    @property
    def any(self) -> bool:
        return bool(self.repeated or self.unknown or self.missed)


def repair(proposal: Sequence[Proposed], draft: Sequence[Group], d: Derived
           ) -> tuple[list[Group], Repairs]:
    """The proposal with every changed file exactly once: a repeated file stays in the first
    commit that named it, a missed file goes back to its draft group (to the proposed commit
    holding most of that group, else to a new commit with the draft's message), a file not in
    the diff is dropped; then the order is fixed as the draft's is. A proposal that names less
    than half of the files is refused (the draft is returned)."""
    repairs = Repairs()
    changed = set(d.paths)
    seen: dict[str, int] = {}
    kept: list[list[str]] = []
    for i, group in enumerate(proposal):
        files: list[str] = []
        for p in group.paths:
            if p not in changed:
                repairs.unknown.append(p)
            elif p in seen:
                repairs.repeated[p] = seen[p] + 1
            else:
                seen[p] = i
                files.append(p)
        kept.append(files)
    if 2 * len(seen) < len(changed) or not proposal:
        repairs.refused = (f"the proposal placed {len(seen)} of {len(changed)} changed files"
                           if proposal else "the model proposed no commit")
        return list(draft), repairs
    messages = [sanitize(g.message.strip()) for g in proposal]  # controls escaped, visibly
    hints = [sanitize(g.hints.strip()) for g in proposal]
    extra: list[Group] = []
    for drafted in draft:
        missing = [p for p in drafted.paths if p not in seen]
        if not missing:
            continue
        holders = [sum(1 for p in drafted.paths if seen.get(p) == i) for i in range(len(kept))]
        if max(holders, default=0) > 0:
            home = holders.index(max(holders))
            kept[home].extend(missing)
            for p in missing:
                repairs.missed[p] = home + 1
        else:
            extra.append(Group(tuple(missing), drafted.message, drafted.hints, drafted.kind))
            for p in missing:
                repairs.missed[p] = len(kept) + len(extra)
    groups = [Group(tuple(files), messages[i], hints[i], "code")
              for i, files in enumerate(kept) if files] + extra
    by_first = {g.paths[0]: g for g in groups}
    ordered = order_groups([list(g.paths) for g in groups], [float(i) for i in
                                                            range(len(groups))], d)
    out: list[Group] = []
    for files in ordered:
        parts = [by_first[p] for p in files if p in by_first]
        out.append(Group(tuple(files), "\n\n".join(dict.fromkeys(g.message for g in parts))
                         if len(parts) > 1 else parts[0].message,
                         " ".join(dict.fromkeys(g.hints for g in parts if g.hints)),
                         parts[0].kind))
    return out, repairs
