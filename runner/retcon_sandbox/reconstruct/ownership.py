"""Whose the cleaned branch is. A run writes every move of the branch into the branch's reflog
with its spec's identity (`tag`: a hash of the spec's real path, and the path). A reflog is
local: nothing a spec, a clone or a fetch brings can write one, and it goes with the branch.

The branch is this spec's when a run of this spec created it at the merge-base, no run of
another spec put a commit that is still on it, and it is at the merge-base or holds commits
the spec records (so your own commits on top after a stuck are kept). `judge` is pure; when
the branch is not this spec's, it says what is true of it instead.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from retcon_sandbox.text import escape_undecodable, sanitize_name

CREATED = "create at merge-base"  # the reason when a run creates the cleaned branch
PREFIX = "retcon-sandbox: "       # Repo.update_branch's, before every reason
_TAGGED = re.compile(r"(?P<what>.*) \(spec (?P<id>[0-9a-f]{16}) (?P<path>.*)\)")


@dataclass(frozen=True)
class SpecId:
    identity: str  # 16 hex digits of the hash of the spec's real path
    path: str      # that path, as text (bytes that are not UTF-8 written \xNN)


def spec_id(spec_real: Path) -> SpecId:
    digest = hashlib.sha256(os.fsencode(spec_real)).hexdigest()[:16]
    return SpecId(digest, escape_undecodable(str(spec_real)))


def tag(reason: str, spec: SpecId) -> str:
    """A reason for the reflog that names the spec whose run moves the branch."""
    return f"{reason} (spec {spec.identity} {spec.path})"


@dataclass(frozen=True)
class Move:
    """One reflog entry: `sha` is where it put the branch."""

    sha: str
    what: str              # the reason given, or the whole message of a move by anything else
    tool: bool             # made by retcon-sandbox
    spec: SpecId | None    # the spec of the run that made it (None: not said, or not a run)


def parse(sha: str, message: str) -> Move:
    if not message.startswith(PREFIX):
        return Move(sha, message, False, None)
    reason = message.removeprefix(PREFIX)
    found = _TAGGED.fullmatch(reason)
    if found is None:  # by hand, or by a version that did not name the spec
        return Move(sha, reason, True, None)
    return Move(sha, found["what"], True, SpecId(found["id"], found["path"]))


@dataclass(frozen=True)
class Refusal:
    why: str        # what is true of the branch, after "the cleaned branch X already exists"
    hint: str
    adopt: bool     # --adopt-branch is a fitting way on, and the hint says so


def judge(reflog: Sequence[tuple[str, str]], me: SpecId, spec_name: str, cleaned: str,
          base: str, chain: Sequence[str], recorded: Sequence[str]) -> Refusal | None:
    """Whether the branch (at `chain[-1]`, or `base` when `chain` is empty) is this spec's.
    `reflog`: its entries, oldest first; `recorded`: the commits the spec's history records."""
    moves = [parse(sha, message) for sha, message in reflog]
    if not moves or not moves[0].tool or moves[0].what != CREATED:
        return Refusal(
            "its reflog does not show a run of retcon-sandbox creating it",
            f"Name a new `cleaned` branch in the spec (the usual case), or delete this one (git "
            f"branch -D {cleaned}) if it is an old result of yours. To add commits on top of "
            "it anyway, rerun with --adopt-branch.", True)
    created = moves[0]
    if created.spec is not None and created.spec.identity != me.identity:
        return Refusal(
            f"a run of another spec, {sanitize_name(created.spec.path)}, created it",
            f"Name a new `cleaned` branch in {spec_name} (the usual case), or delete this one "
            f"(git branch -D {cleaned}) if that spec's result is not needed. To add this "
            "spec's commits on top of it anyway, rerun with --adopt-branch.", True)
    if created.sha != base:
        return Refusal(
            f"a run of {spec_name} created it at {created.sha[:12]}, not at the merge-base "
            f"{base[:12]} this run works from",
            f"Delete it (git branch -D {cleaned}) or name another `cleaned` branch in the "
            "spec.", False)
    return _foreign(moves, me, spec_name, cleaned, base, chain, recorded)


def _foreign(moves: Sequence[Move], me: SpecId, spec_name: str, cleaned: str, base: str,
             chain: Sequence[str], recorded: Sequence[str]) -> Refusal | None:
    """A branch this spec's run created: commits another spec's run put on it, or commits the
    spec does not record on a branch past the merge-base."""
    on_branch = set(chain)
    mine = [sha for sha in recorded if sha in on_branch]
    keep = mine[-1] if mine else base
    for move in moves:
        if move.spec is not None and move.spec.identity != me.identity and \
                move.sha in on_branch:
            return Refusal(
                f"a run of {spec_name} created it, then a run of another spec, "
                f"{sanitize_name(move.spec.path)}, put {move.sha[:12]} on it "
                f"({sanitize_name(move.what)})",
                f"{spec_name}'s history does not record that commit. Reset the branch to the "
                f"last commit it records (git branch -f {cleaned} {keep[:12]}), or name a new "
                "`cleaned` branch in the spec.", False)
    if chain and not recorded:
        return Refusal(
            f"a run of {spec_name} created it at the merge-base, and it holds {len(chain)} "
            "commit(s) past it that the spec's history does not record",
            f"If the history was cleared to start over, delete the branch (git branch -D "
            f"{cleaned}). To keep those commits and add this spec's on top, rerun with "
            "--adopt-branch.", True)
    return None
