"""Checks of a spec against its repository, run before the cleaned branch is created or any
entry is appended: a run that cannot work stops here, with what to do, having written nothing."""

from __future__ import annotations

from dataclasses import dataclass

from retcon_sandbox.errors import GitError, SpecError
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import Repo, refuse_dotgit
from retcon_sandbox.spec.file import Spec
from retcon_sandbox.spec.history import (
    CommitCreated,
    Complete,
    Done,
    Extract,
    Fresh,
    commits_created,
    next_step,
)
from retcon_sandbox.text import sanitize


@dataclass(frozen=True)
class Revisions:
    source: str
    remote: str
    base: str


def revisions(repo: Repo, spec: Spec) -> Revisions:
    """Resolve the spec's branches and check them against git's rules and each other."""
    name = spec.path.name
    problem = repo.branch_name_problem(spec.cleaned)
    if problem:
        raise SpecError(f"{name}: cleaned: {spec.cleaned!r} is not a valid branch name "
                        f"({problem})")
    target = repo.symbolic_target(f"refs/heads/{spec.cleaned}")
    if target is not None:
        raise GitError(f"the cleaned branch {spec.cleaned!r} is a symbolic ref to "
                       f"{sanitize(target)!r}: moving it would move that ref instead",
                       "Name another cleaned branch, or remove the symbolic ref "
                       f"(git symbolic-ref --delete refs/heads/{spec.cleaned}).")
    source = repo.resolve(spec.source)
    remote = repo.resolve(spec.remote)
    for key, ref in (("source", spec.source), ("remote", spec.remote)):
        if repo.full_ref(ref) == f"refs/heads/{spec.cleaned}":
            raise SpecError(f"{name}: cleaned: {spec.cleaned!r} is the same branch as `{key}` "
                            f"({ref!r}); the cleaned branch is rewritten, so it must be another")
    if source == remote:
        raise GitError(f"nothing to reconstruct: source ({spec.source}) and remote "
                       f"({spec.remote}) are the same commit")
    if repo.is_shallow() and not repo.has_merge_base(source, remote):
        raise GitError("this is a shallow clone, and the history that joins source and remote "
                       "is missing", "Fetch it: git fetch --unshallow (in CI: actions/checkout "
                       "with fetch-depth: 0).")
    base = repo.merge_base(source, remote)
    if repo.tree_of(base) == repo.tree_of(source):
        raise GitError(f"nothing to reconstruct: {spec.source} changes nothing since its "
                       f"merge-base with {spec.remote} ({base[:12]})")
    where = repo.checked_out_at(spec.cleaned)
    if where:
        raise GitError(f"the cleaned branch {spec.cleaned!r} is checked out in {where}",
                       "Switch that worktree to another branch first: retcon-sandbox never "
                       "touches a working tree, so it will not move a branch that is checked "
                       "out.")
    return Revisions(source, remote, base)


def recorded_commits(repo: Repo, spec: Spec) -> None:
    for commit in spec.commits:
        for sha in commits_created(commit.history):
            if not repo.exists(sha):
                raise SpecError(f"{spec.path.name}: [[commit]] #{commit.number} → history: "
                                f"commit_created {sha[:12]} does not exist in this repository",
                                "Was the spec written for another clone? Remove the entries of "
                                "commits that do not exist, then rerun.")


@dataclass(frozen=True)
class OffChain:
    """A recorded commit that is not where the history says: on the cleaned branch's
    first-parent chain from the merge-base, after the commits recorded before it."""

    number: int
    sha: str


def off_chain(repo: Repo, spec: Spec, chain: list[str], tip: str) -> OffChain | None:
    """The first recorded commit that does not lie, in order, on `chain` (the cleaned branch's
    first-parent chain from the merge-base to `tip`), or None when all do.

    Each history's commits are in order; the commits made before each `complete` (the logical
    commits and their fixes) are in the spec's order, and the ones after it (remainder fixups)
    come after all of those. Commits of your own between them are fine. One commit may be just
    past the tip: the newest commit of a history, recorded by a run killed before it moved the
    branch there (its parent is the tip; the run finishes that update).
    """
    where = {sha: i for i, sha in enumerate(chain)}
    pending: str | None = None
    main_end = -1
    late: list[tuple[int, str, int]] = []  # (number, sha, position) after a `complete`
    for commit in spec.commits:
        previous = -1
        done = False
        recorded = commits_created(commit.history)
        for entry in commit.history:
            if isinstance(entry, Complete):
                done = True
            if not isinstance(entry, CommitCreated):
                continue
            sha = entry.sha
            position = where.get(sha)
            if position is None and pending is None and sha == recorded[-1] and \
                    not isinstance(next_step(commit.history), Done) and \
                    repo.parent_of(sha) == tip:
                pending, position = sha, len(chain)
            if position is None or position <= previous or (not done and position <= main_end):
                return OffChain(commit.number, sha)
            previous = position
            if done:
                late.append((commit.number, sha, position))
            else:
                main_end = position
    return next((OffChain(n, sha) for n, sha, at in late if at <= main_end), None)


def source_files(repo: Repo, revs: Revisions, max_file_size: int) -> None:
    """The files to reconstruct, from one diff of the merge-base and the source, before anything
    is written: no path is one git treats as `.git` (it would never be committed, so the final
    tree could not equal the source's), and no file is over `max_file_size` (the host would
    refuse to read it in the middle of the run, after earlier commits were made)."""
    changed = repo.diff_entries(revs.base, revs.source)
    for path, _, _, _ in changed:
        refuse_dotgit(path)
    repo.refuse_oversized(sorted((path, new) for path, _, _, new in changed if new is not None),
                          max_file_size, " on the source branch", " Nothing was written.")


def path_patterns(repo: Repo, spec: Spec, tip: str, source: str) -> None:
    """Every pattern of a `paths` commit still to extract must match something still to
    reconstruct."""
    remaining = repo.changed_paths(tip, source)
    for commit in spec.commits:
        if commit.paths is None or not isinstance(next_step(commit.history), Fresh | Extract):
            continue
        unmatched = Patterns(commit.paths).unmatched(remaining)
        if unmatched:
            exists = repo.branch_sha(spec.cleaned) is not None
            # two trees (the cleaned branch's tip), or the merge-base's (three dots) before it
            listing = f"{spec.cleaned} {spec.source}" if exists else \
                f"{spec.remote}...{spec.source}"
            raise SpecError(
                f"{spec.path.name}: [[commit]] #{commit.number} → paths: "
                + ", ".join(repr(p) for p in unmatched) + f" match(es) no path that differs "
                f"between {spec.cleaned} and {spec.source}",
                ("The cleaned branch already exists: what its commits carry no longer differs "
                 "(a branch left by an earlier run? delete it to start over). " if exists else "")
                + f"Check the spelling; `git diff --name-only {listing}` lists the paths. "
                "Patterns use git's glob rules: `docs/**`, `*.md`, `src/**/test_*.py`.")


def versions(repo: Repo, spec: Spec, source: str, base: str) -> None:
    """Every `versions` commit still to take is a commit of the source branch since the
    merge-base: a spec cannot bring in content from anywhere else."""
    for commit in spec.commits:
        if not isinstance(next_step(commit.history), Fresh | Extract):
            continue
        for path, sha in commit.versions:
            if repo.exists(sha) and repo.is_ancestor(sha, source) and \
                    not repo.is_ancestor(sha, base):
                continue
            raise SpecError(
                f"{spec.path.name}: [[commit]] #{commit.number} → versions → {path!r}: "
                f"{sha[:12]} is not a commit of {spec.source} since its merge-base with "
                f"{spec.remote}", "Give one of the commits `git log --format=%H "
                f"{spec.remote}..{spec.source}` lists, or remove the entry to take the file "
                "whole from the source.")
