"""Where each commit's content came from. A reconstruction only moves content from the source
branch onto the base, so every path a commit changes should end up as it is in the base or as it
is in the source. A path whose content is in neither was written by the model (or a fix), which
is normal for a partly applied file, and also how a prompt-injected model would slip in a file
and remove it later, unseen by the final tree check. Every run reports these paths per commit;
`--strict-provenance` makes such a commit stuck until a human has looked.

`classify` and `gate` are pure; `of_commit` reads the commits from git.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.spec.history import PROVENANCE_PREFIX

PREFIX = PROVENANCE_PREFIX


@dataclass(frozen=True)
class Provenance:
    novel: tuple[str, ...] = ()    # content in neither the base nor the source
    foreign: tuple[str, ...] = ()  # of those, paths that exist in neither

    def __bool__(self) -> bool:
        return bool(self.novel)


def classify(changes: Iterable[tuple[str, TreeEntry | None]], base: Mapping[str, TreeEntry],
             source: Mapping[str, TreeEntry]) -> Provenance:
    """The changed paths (new state; None: deleted) whose new state matches neither tree."""
    novel = sorted({path for path, entry in changes
                    if entry != base.get(path) and entry != source.get(path)})
    foreign = [p for p in novel if p not in base and p not in source]
    return Provenance(tuple(novel), tuple(foreign))


def gate(found: Provenance, strict: bool, stuck: str | None, note: str | None) -> str | None:
    """The `stuck` summary that stops a verified commit, or None. Under --strict-provenance a
    commit with novel content stops once; a human's `resolved` note after that stop lets it go."""
    if not strict or not found:
        return None
    if stuck is not None and stuck.startswith(PREFIX) and note is not None:
        return None
    shown = ", ".join(found.novel[:10]) + (" …" if len(found.novel) > 10 else "")
    foreign = f" ({len(found.foreign)} exist in neither)" if found.foreign else ""
    return (f"{PREFIX} --strict-provenance: {len(found.novel)} path(s) have content that is "
            f"in neither the base nor the source{foreign}: {shown}. Check them (git show), "
            "then resolve to accept, or fix the commit.")


def of_commits(repo: Repo, commits: Iterable[str], base: Mapping[str, TreeEntry],
               source: Mapping[str, TreeEntry]) -> Provenance:
    """Over every commit of a logical commit (fixes included), each against its parent."""
    changes: list[tuple[str, TreeEntry | None]] = []
    for sha in commits:
        parent = repo.parent_of(sha)
        if parent is not None:
            changes += repo.tree_changes(parent, sha)
    return classify(changes, base, source)
