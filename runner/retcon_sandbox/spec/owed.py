"""What a logical commit still owes: the files it names (its `paths`, or its hints by path or
file name) that still differ from the source branch. A commit may end without a commit of its
own ("nothing to extract") only when it owes nothing, or when the model names a later commit
that holds what is left and that commit names every one of those files too: else the commit
would vanish from the history while its changes wait for whichever commit takes them. Pure:
decided from the spec and the changed paths alone."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from retcon_sandbox.paths import Patterns
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.text import escape_undecodable

SHOWN = 10  # files named in a refusal at most


def names(commit: CommitSpec, path: str) -> bool:
    """Whether the commit names `path`: a pattern of its `paths` matches it, or its hints name
    the path, or (for a name with an extension) its file name, as a word of its own."""
    if commit.paths is not None:
        return Patterns(commit.paths).matches(path)
    if not commit.hints:
        return False
    base = path.rsplit("/", 1)[-1]
    candidates = (path, base) if "." in base.strip(".") else (path,)
    return any(re.search(r"(?<![\w./-])" + re.escape(name) + r"(?![\w/-])", commit.hints)
               for name in candidates)


@dataclass(frozen=True)
class Owed:
    """Why commit `number` may not end without a commit: `files` it names still differ, and
    `held_by` (the later commit the model named, if any) does not hold them (`why`)."""

    number: int
    subject: str
    files: tuple[str, ...]
    held_by: int | None = None
    why: str = ""

    def listed(self) -> str:
        """The files, a byte of a name that is not UTF-8 written `\\xNN` (the summary goes
        into the spec)."""
        more = len(self.files) - SHOWN
        return escape_undecodable(", ".join(self.files[:SHOWN])) + (
            f" and {more} more" if more > 0 else "")

    def for_model(self) -> str:
        """The tool's refusal: what is owed, and the ways on."""
        held = f" {self.why}." if self.why else ""
        return (f"these files, named by this commit, still differ from the source branch: "
                f"{self.listed()}.{held} Take this commit's change of them (read_diff with the "
                "path shows it) and call create_commit. If a later commit holds all that is "
                "left of them, call nothing_to_extract with held_by set to that commit's "
                "number (it must name each of these files). If you can do neither, call "
                "report_stuck and say why.")

    def summary(self) -> str:
        """The stop, when the model says "nothing to extract" again: which commit has none."""
        held = f"; {self.why}" if self.why else "; it named no later commit that holds them"
        return (f"commit #{self.number} ({self.subject}) has no commit: the model said nothing "
                f"is left to extract, but {self.listed()}, named by this commit, still "
                f"differ from the source branch{held}. A `resolved` note can say what to take, "
                "or which later commit holds them; or change the hints so that one commit "
                "names them.")


def still_owed(commit: CommitSpec, commits: Sequence[CommitSpec], changed: Sequence[str],
               held_by: int | None = None) -> Owed | None:
    """None when `commit` may end without a commit, the source branch still differing at
    `changed`; else what it owes. `held_by`: the later commit the model says holds it."""
    files = tuple(path for path in changed if names(commit, path))
    if not files:
        return None
    owed = Owed(commit.number, commit.subject, files, held_by)
    if held_by is None:
        return owed
    if not commit.number < held_by <= len(commits):
        return Owed(commit.number, commit.subject, files, held_by,
                    f"commit #{held_by} is not a later commit (this is #{commit.number} of "
                    f"{len(commits)})")
    later = commits[held_by - 1]
    missing = tuple(path for path in files if not names(later, path))
    if missing:
        shown = escape_undecodable(", ".join(missing[:SHOWN])) + (
            " ..." if len(missing) > SHOWN else "")
        return Owed(commit.number, commit.subject, files, held_by,
                    f"commit #{held_by} does not name {shown}")
    return None
