"""What the planner knows about a branch, read by the command through the git adapter: the
changed files, the messy commits that touched them, and the text of the files it reads imports
from. Plain values: the planner does no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Change:
    """One path of the diff base..source: `A`dded, `M`odified (a mode change too) or `D`eleted."""

    path: str
    status: str
    old_blob: str | None = None
    new_blob: str | None = None


@dataclass(frozen=True)
class MessyCommit:
    subject: str
    paths: tuple[str, ...]  # the paths it touched, as git names them
    blobs: tuple[tuple[str | None, str | None], ...] = ()  # each path's before and after
    sha: str = ""  # its commit id
    layout: bool = False  # 3 or more files, each only laid out anew (evidence.layout_only)


@dataclass(frozen=True)
class Facts:
    changes: tuple[Change, ...]
    commits: tuple[MessyCommit, ...]  # oldest first
    source_files: frozenset[str] = frozenset()  # every file of the source tree
    texts: dict[str, str] = field(default_factory=dict)  # source text of changed text files
    base_texts: dict[str, str] = field(default_factory=dict)  # base text of modified/deleted
    log_subjects: tuple[str, ...] = ()  # recent subjects of the remote, for the style
    setup_texts: dict[str, str] = field(default_factory=dict)  # render.SETUP_TEXTS' text

    @property
    def paths(self) -> list[str]:
        return [c.path for c in self.changes]
