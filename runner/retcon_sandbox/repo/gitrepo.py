"""The git adapter: the one module that imports GitPython.

Every git command goes through `Repo._git`. Nothing here checks out, resets or touches the
user's working tree, index or HEAD: trees are built on a temporary index, commits with
`commit-tree`, and refs move only by compare-and-swap.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import git
import git.exc
from gitdb.base import IStream  # type: ignore[import-untyped]
from gitdb.exc import ODBError  # type: ignore[import-untyped]

from retcon_sandbox.archive import TarStream
from retcon_sandbox.errors import GitError
from retcon_sandbox.paths import dotgit_component
from retcon_sandbox.text import escape_undecodable, sanitize_name

ZERO = "0" * 40
TAR_BLOCK = 1 << 20  # the tar stream is produced in blocks of about this size
FALLBACK_IDENTITY = {
    "GIT_AUTHOR_NAME": "retcon-sandbox",
    "GIT_AUTHOR_EMAIL": "retcon-sandbox@localhost",
    "GIT_COMMITTER_NAME": "retcon-sandbox",
    "GIT_COMMITTER_EMAIL": "retcon-sandbox@localhost",
}
# Never let repository content steer the host's git: every call runs no hook, no fsmonitor and
# no signing program, whatever the repository's config says (a fork's `.git` is untrusted too)...
NO_PROGRAMS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
               "-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false",
               # `log` and `reflog show` would verify a signed commit with gpg.program
               "-c", "log.showSignature=false",
               "-c", "core.untrackedCache=false", "-c", "core.splitIndex=false",
               # and a large blob is treated as binary by diffs, never loaded whole
               "-c", "core.bigFileThreshold=32m")
PERSISTENT = ("core.bigFileThreshold=32m", "core.packedGitWindowSize=16m",
              "core.packedGitLimit=32m")
# fast-import runs no hook, signing program or fsmonitor (it writes objects, never a commit here,
# never the index or the working tree), and with four or more distinct `-c` settings git 2.47's
# fast-import spends five times the CPU (0.25 s against 0.05 s for 5,000 small blobs): so only
# these.
FAST_IMPORT = ("-c", "core.hooksPath=/dev/null", "-c", "core.bigFileThreshold=32m")
FAST_IMPORT_FROM = 3  # blobs: one fast-import costs 5.8 ms of CPU, a hash-object (each) 2.8
# ...and no external diff or textconv drivers.
SAFE_DIFF = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-renames")


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    sha: str


@dataclass(frozen=True)
class FileChange:
    """A path's new state: `None` deletes it."""

    path: str
    entry: TreeEntry | None


_NOTE_NAME = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # an object id (SHA-1 or SHA-256)
_OBJECT_ID = _NOTE_NAME  # git reads a full id as that object, never as a ref of that name
T = TypeVar("T")
TREES_KEPT = 200_000  # the most tree entries `ls_tree` keeps from earlier calls (< 100 MB)
_TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]{0,127}")


# What GitPython (and gitdb under it) raise: its own errors, and the OS's when a file of the
# repository cannot be read or written (a read-only object database, a full disk).
LIBRARY_ERRORS: tuple[type[Exception], ...] = (git.exc.GitError, ODBError, OSError)
READ_ERRORS: tuple[type[Exception], ...] = (ValueError, *LIBRARY_ERRORS)  # and a bad object id


class Repo:
    @classmethod
    def init(cls, path: Path, branch: str = "main") -> Repo:
        try:
            git.Repo.init(path, initial_branch=branch)
        except LIBRARY_ERRORS as exc:
            raise GitError(f"cannot create a repository in {path}: {exc}") from None
        return cls(path)

    def __init__(self, path: Path) -> None:
        try:
            self._repo = git.Repo(path, search_parent_directories=True)
        except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError):
            raise GitError(f"{path} is not inside a git repository",
                           "Run retcon-sandbox from the repository, or put the spec there."
                           ) from None
        except LIBRARY_ERRORS as exc:
            raise GitError(f"cannot open the repository at {path}: {_first_line(exc)}",
                           "Check that it is readable by you and that git works there "
                           "(`git status`).") from None
        if self._repo.bare:
            self.root = Path(self._repo.git_dir)
        else:
            self.root = Path(self._repo.working_tree_dir or path)
        self._identity_env: dict[str, str] | None = None
        self._object_format: str | None = None
        self._common_dir: Path | None = None
        # What git answered about an object id: an object is named by its content, so the
        # answer stays true, and one command need not ask twice. Never a ref's value: a ref
        # moves, and is read again each time it is asked for.
        self._known: dict[tuple[str, str], object] = {}
        self._trees: OrderedDict[str, dict[str, TreeEntry]] = OrderedDict()
        self._trees_lock = threading.Lock()  # `verify -j` reads trees from several threads
        self._sizes: dict[str, int] = {}  # blob -> its size, as `blob_sizes` found it
        # GitPython's own long-running `cat-file --batch` (blobs read for the tar stream) gets
        # the same large-file threshold, so a blob over it streams rather than being inflated
        # whole, and a small pack window, so reading a large repository does not map it all.
        self._repo.git.set_persistent_git_options(c=list(PERSISTENT))

    # -- the one door to git ----------------------------------------------------------------

    def _git(self, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
             strip: bool = True) -> str:
        return str(self._run(args, stdin, env, strip, True))

    def _run(self, args: tuple[str, ...], stdin: bytes | None, env: dict[str, str] | None,
             strip: bool, text: bool) -> str | bytes:
        command = ["git", *NO_PROGRAMS, *args]
        full_env = {**os.environ, **(env or {})}
        try:
            if stdin is None:
                out = self._repo.git.execute(command, env=full_env, strip_newline_in_stdout=strip,
                                             stdout_as_string=text)
            else:
                with tempfile.TemporaryFile() as handle:
                    handle.write(stdin)
                    handle.seek(0)
                    out = self._repo.git.execute(command, env=full_env, istream=handle,
                                                 strip_newline_in_stdout=strip,
                                                 stdout_as_string=text)
        except git.exc.GitCommandError as exc:
            detail = (exc.stderr or "").strip().removeprefix("stderr: ").strip("'\n ")
            raise GitError(f"git {args[0]} failed: {detail or exc}") from None
        except LIBRARY_ERRORS as exc:  # git not runnable, a temporary file not writable
            raise GitError(f"git {args[0]} failed: {_first_line(exc)}") from None
        return out if isinstance(out, str | bytes) else str(out)

    # -- reading ----------------------------------------------------------------------------

    def resolve(self, rev: str) -> str:
        try:
            sha = self._of_object("commit", rev, lambda: self._git(
                "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"))
        except GitError:
            raise GitError(f"unknown revision {rev!r} in the repository {self.root}",
                           f"Check the branch name (`git -C {self.root} branch -a` lists them). "
                           "The repository is the one containing the current directory, else "
                           "the spec's directory; --repo DIR chooses another.") from None
        self._known.setdefault(("commit", sha), sha)  # a commit's id resolves to itself
        self._known.setdefault(("exists", sha), sha)
        return sha

    def resolve_all(self, revs: list[str]) -> dict[str, str]:
        """The commit each of `revs` names, of those that name one (as `resolve` finds it):
        one `cat-file --batch-check` for them all, not one rev-parse each."""
        if any(not rev or rev != rev.strip() or "\n" in rev for rev in revs):  # not one a line
            found = {}
            for rev in revs:
                with contextlib.suppress(GitError):
                    found[rev] = self.resolve(rev)
            return found
        out = self._git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                        stdin="".join(f"{rev}^{{commit}}\n" for rev in revs).encode())
        found = {}
        for rev, line in zip(revs, out.splitlines(), strict=False):
            sha, _, kind = line.partition(" ")
            if kind == "commit" and _OBJECT_ID.fullmatch(sha):
                found[rev] = sha
        return found

    def branch_sha(self, branch: str) -> str | None:
        try:
            return self._git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        except GitError:
            return None

    def describe_tag(self, rev: str) -> str | None:
        """The nearest tag reachable from `rev` (`git describe --tags --abbrev=0`), if its name
        is a plain version-like name; None otherwise."""
        try:
            tag = self._git("describe", "--tags", "--abbrev=0", rev)
        except GitError:
            return None
        return tag if _TAG_NAME.fullmatch(tag) and ".." not in tag else None

    def describe(self, rev: str) -> tuple[str, int] | None:
        """The nearest tag reachable from `rev` and the number of commits from it to `rev`
        (`git describe --tags --long`), if the tag's name is a plain version-like name."""
        try:
            found = self._git("describe", "--tags", "--long", rev)
        except GitError:
            return None
        tag, distance, _ = found.rsplit("-", 2)
        if not _TAG_NAME.fullmatch(tag) or ".." in tag or not distance.isdigit():
            return None
        return tag, int(distance)

    def merge_base(self, a: str, b: str) -> str:
        try:
            return self._git("merge-base", a, b)
        except GitError:
            raise GitError(f"{a[:12]} and {b[:12]} share no history (no merge-base)") from None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        try:
            self._git("merge-base", "--is-ancestor", ancestor, descendant)
        except GitError:
            return False
        return True

    def exists(self, sha: str) -> bool:
        if ("exists", sha) in self._known:
            return True
        try:
            self._git("cat-file", "-e", f"{sha}^{{commit}}")
        except GitError:
            return False
        return True

    def tree_of(self, commit: str) -> str:
        return self._of_object("tree", commit,
                               lambda: self._git("rev-parse", f"{commit}^{{tree}}"))

    def parent_of(self, commit: str) -> str | None:
        def ask() -> str | None:
            out = self._git("rev-list", "--parents", "-n", "1", commit).split()
            return out[1] if len(out) > 1 else None
        return self._of_object("parent", commit, ask)

    def message_of(self, commit: str) -> str:
        return self._of_object("message", commit, lambda: self._git(
            "log", "-1", "--format=%B", commit, strip=False).rstrip("\n"))

    def _of_object(self, what: str, rev: str, ask: Callable[[], T]) -> T:
        """`ask()`, or what it answered before for the same full object id (`_known`); a
        revision that is not one (a branch, `HEAD~1`) is asked about each time."""
        if not _OBJECT_ID.fullmatch(rev):
            return ask()
        if (what, rev) not in self._known:
            self._known[(what, rev)] = ask()
            if what in ("commit", "parent", "message"):  # it names a commit: `exists` is true
                self._known[("exists", rev)] = rev
        return cast(T, self._known[(what, rev)])

    def common_dir(self) -> Path:
        """The repository's git directory shared by all its worktrees (it never moves while a
        command runs: asked once, with the object format)."""
        if self._common_dir is None:
            out = self._git("rev-parse", "--path-format=absolute", "--git-common-dir",
                            "--show-object-format").splitlines()
            self._common_dir = Path(out[0])
            self._object_format = out[1] if len(out) > 1 and out[1] else "sha1"
        return self._common_dir

    def full_ref(self, rev: str) -> str:
        """The full ref name a revision names (`refs/heads/x`), or "" for a plain commit."""
        try:
            out = self._git("rev-parse", "--symbolic-full-name", "--end-of-options", rev)
        except GitError:
            return ""
        names = [line for line in out.splitlines() if line != "--end-of-options"]  # echoed
        return names[-1] if names else ""

    def branch_name_problem(self, name: str) -> str | None:
        """Why git would refuse `name` as a branch name, or None."""
        try:
            self._git("check-ref-format", "--branch", name)
        except GitError:
            return "git check-ref-format refuses it: no spaces, `..`, `~^:?*[\\`, control " \
                   "characters, and no leading `-` or trailing `.lock`"
        return None

    def root_commits(self, rev: str) -> list[str]:
        """The commits without parents in `rev`'s history (a shallow clone's boundary counts);
        none when `rev` names no commit."""
        try:
            return self._git("rev-list", "--max-parents=0", rev, "--").split()
        except GitError:
            return []

    def is_shallow(self) -> bool:
        return self._git("rev-parse", "--is-shallow-repository") == "true"

    def has_merge_base(self, a: str, b: str) -> bool:
        try:
            self._git("merge-base", a, b)
        except GitError:
            return False
        return True

    def symbolic_target(self, ref: str) -> str | None:
        """What `ref` points to when it is a symbolic ref (a `ref: refs/...` file), else None."""
        try:
            return self._git("symbolic-ref", "-q", "--no-recurse", ref) or None
        except GitError:
            return None

    def checked_out_at(self, branch: str) -> str | None:
        """The worktree (main or linked) that has `branch` checked out, if any."""
        out = self._git("worktree", "list", "--porcelain", "-z", strip=False)
        path = None
        for field in out.split("\0"):
            if field.startswith("worktree "):
                path = field[len("worktree "):]
            elif field == f"branch refs/heads/{branch}":
                return path or "a worktree"
        return None

    def diff_lines(self, old: str, new: str) -> int:
        """Lines added plus lines removed between two trees (binary files count 0)."""
        out = self._git("diff", *SAFE_DIFF, "--numstat", "-z", old, new, strip=False)
        total = 0
        for record in out.split("\0"):
            parts = record.split("\t")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                total += int(parts[0]) + int(parts[1])
        return total

    def numstat(self, old: str, new: str) -> list[tuple[str, int | None, int | None]]:
        """(path, lines added, lines removed) of each path that differs between two trees or
        commits; None for a binary file's counts."""
        out = self._git("diff", *SAFE_DIFF, "--numstat", "-z", old, new, strip=False)
        found: list[tuple[str, int | None, int | None]] = []
        for record in out.split("\0"):
            parts = record.split("\t", 2)
            if len(parts) == 3:
                added, removed, path = parts
                found.append((path, int(added) if added.isdigit() else None,
                              int(removed) if removed.isdigit() else None))
        return found

    def diff(self, old: str, new: str, paths: tuple[str, ...] = ()) -> str:
        return self._git("diff", *SAFE_DIFF, old, new, "--", *paths, strip=False)

    def diff_stat(self, old: str, new: str) -> str:
        return self._git("diff", *SAFE_DIFF, "--stat=120,80", old, new)

    def changed_paths(self, old: str, new: str) -> list[str]:
        out = self._git("diff", *SAFE_DIFF, "--name-only", "-z", old, new, strip=False)
        return [p for p in out.split("\0") if p]

    def ls_tree(self, tree: str) -> dict[str, TreeEntry]:
        """Every file of `tree` (or of a commit's tree), by path: a dict of the caller's own.
        A full object id's entries are kept for the next call (the last few trees, up to
        TREES_KEPT entries in all): one step reads the same tree several times."""
        with self._trees_lock:
            kept = self._trees.get(tree)
            if kept is not None:
                self._trees.move_to_end(tree)
                return dict(kept)
        out = self._git("ls-tree", "-r", "-z", "--full-tree", tree, strip=False)
        entries: dict[str, TreeEntry] = {}
        for record in out.split("\0"):
            if not record:
                continue
            meta, path = record.split("\t", 1)
            mode, _kind, sha = meta.split()
            entries[path] = TreeEntry(mode, sha)
        if _OBJECT_ID.fullmatch(tree) and len(entries) <= TREES_KEPT:
            with self._trees_lock:
                self._trees[tree] = entries
                while sum(map(len, self._trees.values())) > TREES_KEPT:
                    self._trees.popitem(last=False)
            return dict(entries)
        return entries

    def tree_index(self, tree: str) -> bytes:
        """`tree`'s entries as `update-index -z --index-info` records: what a sandbox's git
        metadata is made from, so that its HEAD holds exactly this tree."""
        return b"".join(_index_record(path, entry) for path, entry in self.ls_tree(tree).items())

    def blob(self, sha: str, limit: int | None = None) -> bytes:
        """A blob's content; with `limit`, its size is checked before it is read."""
        try:
            if limit is not None:
                size = self._repo.odb.info(bytes.fromhex(sha)).size
                if size > limit:
                    raise GitError(f"object {sha[:12]} is {size} bytes, over the largest file "
                                   f"the host reads ({limit} bytes)",
                                   "Raise [sandbox] max_file_size if you trust this "
                                   "repository.")
            data: bytes = self._repo.odb.stream(bytes.fromhex(sha)).read()
        except READ_ERRORS as exc:
            raise GitError(f"cannot read object {sha[:12]}: {_first_line(exc)}") from None
        return data

    def blob_chunks(self, sha: str, limit: int) -> Iterator[bytes]:
        """A blob's content in blocks of TAR_BLOCK, read as they are consumed (never whole);
        its size is checked against `limit` now, before anything is read."""
        try:
            size = self._repo.odb.info(bytes.fromhex(sha)).size
        except READ_ERRORS as exc:
            raise GitError(f"cannot read object {sha[:12]}: {_first_line(exc)}") from None
        if size > limit:
            raise GitError(f"object {sha[:12]} is {size} bytes, over the largest file the host "
                           f"reads ({limit} bytes)",
                           "Raise [sandbox] max_file_size if you trust this repository.")
        return self._blob_blocks(sha)

    def first_parent_chain(self, base: str, tip: str) -> list[str] | None:
        """The commits from `base` (excluded) to `tip`, oldest first, following first parents
        only; None when that walk from `tip` does not pass through `base`."""
        if tip == base:
            return []
        chain = self._git("rev-list", "--first-parent", "--reverse", "--end-of-options", tip,
                          f"^{base}").split()
        if not chain or self.parent_of(chain[0]) != base:
            return None
        return chain

    def reflog(self, branch: str) -> list[tuple[str, str]]:
        """(sha, message) of each entry of `branch`'s reflog, oldest first: how this branch came
        to be in this repository and what moved it (deleting a branch deletes its reflog).
        Empty without a reflog."""
        try:
            out = self._git("reflog", "show", "--format=%H %gs", f"refs/heads/{branch}", "--")
        except GitError:
            return []
        return [(line[:40], line[41:]) for line in reversed(out.splitlines()) if line]

    def log(self, base: str, tip: str) -> list[tuple[str, str]]:
        out = self._git("log", "--reverse", "--format=%H %s", f"{base}..{tip}")
        return [(line[:40], line[41:]) for line in out.splitlines() if line]

    # -- writing objects (never files) ------------------------------------------------------

    def write_blob(self, data: bytes) -> str:
        try:
            stream = self._repo.odb.store(IStream(b"blob", len(data), io.BytesIO(data)))
        except LIBRARY_ERRORS as exc:  # a read-only object database, a full disk
            raise GitError(f"cannot write an object into the repository {self.root}: "
                           f"{_first_line(exc)}", "Check that the repository is writable and "
                           "its disk is not full.") from None
        return str(stream.hexsha.decode() if isinstance(stream.hexsha, bytes) else stream.hexsha)

    @contextlib.contextmanager
    def blob_batch(self) -> Iterator[BlobBatch]:
        """Blobs written in one batch by one `git fast-import` (one process, one pack, a
        large blob streamed, never held whole). Their ids are known at once; the objects are
        readable once the block exits."""
        try:
            algorithm = self.object_format()
            proc = self._repo.git.execute(
                ["git", *FAST_IMPORT, "fast-import", "--quiet", "--depth=0",
                 "--big-file-threshold=32m"],
                as_process=True, istream=subprocess.PIPE, env=dict(os.environ))
        except LIBRARY_ERRORS as exc:
            raise GitError(f"cannot start git fast-import: {_first_line(exc)}") from None
        if proc.proc is None:
            raise GitError("cannot start git fast-import")
        batch = BlobBatch(proc.proc, algorithm)
        try:
            yield batch
        finally:
            batch.finish()

    def tree_from_entries(self, entries: dict[str, TreeEntry]) -> str:
        """A tree holding exactly `entries` (blobs already written): every tree object, deepest
        first, by one `git mktree --batch`; each id git gives must be the one computed here
        from the entries, or nothing is used."""
        return self.start_tree(entries, blobs_pending=False).result()

    def start_tree(self, entries: dict[str, TreeEntry], blobs_pending: bool) -> PendingTree:
        """`tree_from_entries`, started: `result()` waits for it. `blobs_pending`: the blobs
        are still being written (a `blob_batch` finishing), so git does not look for them;
        the caller uses the tree only once that batch has finished without error."""
        for path in entries:
            refuse_dotgit(path)
        trees = _trees_of(entries, self.object_format())
        handle = tempfile.TemporaryFile()  # noqa: SIM115 (closed by PendingTree.result)
        handle.write(b"".join(t.mktree_input for t in trees))
        handle.seek(0)
        flags = ["--missing"] if blobs_pending else []
        try:
            proc = self._repo.git.execute(["git", *NO_PROGRAMS, "mktree", "-z", "--batch",
                                           *flags], as_process=True, istream=handle)
        except LIBRARY_ERRORS as exc:
            handle.close()
            raise GitError(f"cannot start git mktree: {exc}") from None
        if proc.proc is None:
            handle.close()
            raise GitError("cannot start git mktree")
        return PendingTree(proc, handle, [t.sha for t in trees])

    def object_format(self) -> str:
        """sha1 or sha256: how this repository names objects."""
        if self._object_format is None:
            self.common_dir()  # asks for both
        assert self._object_format is not None
        return self._object_format

    def make_tree(self, base_tree: str, changes: list[FileChange]) -> str:
        """Base tree plus changes, through a temporary index; the user's index is never used.
        Records are NUL-separated, so a name holding a newline is one name, never a second
        entry; the tree written is then checked against the changes asked for."""
        if not changes:
            return base_tree
        for change in changes:
            refuse_dotgit(change.path)
        records = [_index_record(c.path, c.entry) for c in changes]
        with tempfile.TemporaryDirectory(prefix="retcon-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self._git("read-tree", base_tree, env=env)
            self._git("update-index", "-z", "--index-info", stdin=b"".join(records), env=env)
            tree = self._git("write-tree", env=env)
        self._check_tree(base_tree, tree, changes)
        return tree

    def tree_changes(self, old: str, new: str) -> list[tuple[str, TreeEntry | None]]:
        """Each path that differs between two trees (or commits), with its entry in `new`
        (None: deleted there)."""
        out = self._git("diff-tree", "-r", "-z", "--no-renames", old, new, strip=False)
        fields = out.split("\0")
        changes: list[tuple[str, TreeEntry | None]] = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            parts = meta.lstrip(":").split()
            if len(parts) == 5:
                changes.append((path, None if parts[4] == "D" else TreeEntry(parts[1], parts[3])))
        return changes

    def tree_changes_from(self, old: str, new: str
                          ) -> list[tuple[str, TreeEntry | None, TreeEntry | None]]:
        """Each path that differs between two trees (or commits), with its entry in `old` and
        in `new` (None: absent there)."""
        out = self._git("diff-tree", "-r", "-z", "--no-renames", old, new, strip=False)
        fields = out.split("\0")
        changes: list[tuple[str, TreeEntry | None, TreeEntry | None]] = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            parts = meta.lstrip(":").split()
            if len(parts) == 5:
                changes.append((path, None if parts[4] == "A" else TreeEntry(parts[0], parts[2]),
                                None if parts[4] == "D" else TreeEntry(parts[1], parts[3])))
        return changes

    def _check_tree(self, base_tree: str, tree: str, changes: list[FileChange]) -> None:
        """The tree differs from its base by exactly the changes asked for."""
        wanted = {c.path: c.entry for c in changes}
        got = dict(self.tree_changes(base_tree, tree))
        unchanged = [p for p in wanted if p not in got]
        base = self.ls_tree(base_tree) if unchanged else {}
        expected = {p: e for p, e in wanted.items() if p in got or base.get(p) != e}
        if got != expected:
            odd = sorted(set(got) ^ set(expected)) or sorted(
                p for p in got if got[p] != expected.get(p))
            raise GitError("the tree git wrote is not the one asked for (paths: "
                           + ", ".join(repr(p) for p in odd[:5]) + ")",
                           "Nothing was committed. Report this: a name may be one git "
                           "rewrites.")

    def commit_tree(self, tree: str, parent: str, message: str) -> str:
        """A commit message is UTF-8: a name in it that is not (`latin\\xe9.txt`, listed by
        the remainder's commit) has each such byte written `\\xNN`, as the terminal shows it."""
        text = escape_undecodable(message.rstrip("\n")) + "\n"
        sha = self._commit_object(("commit-tree", tree, "-p", parent, "-F", "-"), text.encode())
        if _OBJECT_ID.fullmatch(tree):
            self._known[("tree", sha)] = tree  # what `tree_of` would answer
        return sha

    def _commit_object(self, args: tuple[str, ...], message: bytes) -> str:
        """`git commit-tree ARGS` with `message`, as the configured identity, or as
        retcon-sandbox where none is configured (`_identity`). commit-tree needs the very
        identity `git var` checks, so it is tried first, and `git var` asked only if it fails:
        one git call a commit, not three."""
        if self._identity_env is None:
            try:
                sha = self._git(*args, stdin=message)
            except GitError:
                pass  # no identity, perhaps: `_identity` says, and the commit is tried again
            else:
                self._identity_env = {}
                return sha
        return self._git(*args, stdin=message, env=self._identity())

    def _identity(self) -> dict[str, str]:
        if self._identity_env is None:
            try:
                self._git("var", "GIT_COMMITTER_IDENT")
                self._git("var", "GIT_AUTHOR_IDENT")
                self._identity_env = {}
            except GitError:
                self._identity_env = {k: v for k, v in FALLBACK_IDENTITY.items()
                                      if k not in os.environ}
        return self._identity_env

    def update_branch(self, branch: str, new: str, old: str | None, reason: str) -> None:
        """Compare-and-swap: move refs/heads/<branch> to `new` only if it is still at `old`."""
        try:
            self._git("update-ref", "--no-deref", *(() if old else ("--create-reflog",)),
                      "-m", f"retcon-sandbox: {reason}", f"refs/heads/{branch}", new,
                      old or ZERO)
        except GitError as exc:
            lock = self._ref_lock(branch)
            if os.path.lexists(lock):
                raise GitError(f"branch {branch!r} is locked by {lock}, which a git process "
                               "left (one running now, or one that was killed)",
                               "If no git command is running in this repository, remove it "
                               f"(rm {lock}) and rerun: the run resumes from the spec."
                               ) from None
            raise GitError(f"branch {branch!r} moved while retcon-sandbox was working on it "
                           f"({exc.message})", "Rerun: the run resumes from the spec.") from None

    def clear_interrupted_update(self, branch: str, new: str) -> bool:
        """Remove the lock an update of `branch` to `new` left when it was killed (kill -9
        between git's lock and its rename): a regular file holding `new`, the value that update
        was writing, or nothing yet. Any other lock is left alone. True if one was removed."""
        lock = self._ref_lock(branch)
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False  # none, or a symlink: not such a lock
        try:
            held = os.read(fd, 128).strip()
        except OSError:
            return False  # a directory: not such a lock
        finally:
            os.close(fd)
        if held not in (b"", new.encode()):
            return False
        try:
            os.unlink(lock)
        except FileNotFoundError:
            pass  # its git process finished after all
        except OSError as exc:
            raise GitError(f"cannot remove {lock}: {exc.strerror}",
                           f"Remove it (rm {lock}) and rerun.") from None
        return True

    def _ref_lock(self, branch: str) -> Path:
        return self.common_dir() / "refs" / "heads" / f"{branch}.lock"

    def commit_files(self, branch: str, files: dict[str, str | None], message: str) -> str:
        """Commit `files` (None deletes) on top of `branch` (created if missing): our own content
        only, for the demo and the tests."""
        parent = self.branch_sha(branch)
        base = self.tree_of(parent) if parent else ""
        contents = {c for c in files.values() if c is not None}
        if len(contents) < FAST_IMPORT_FROM:
            blobs = {c: self.write_blob(c.encode()) for c in contents}
        else:
            with self.blob_batch() as batch:  # one git process for all the blobs, not one each
                blobs = {c: batch.write(len(c.encode()), iter([c.encode()])) for c in contents}
        changes = [FileChange(p, TreeEntry("100644", blobs[c]) if c is not None else None)
                   for p, c in files.items()]
        if parent:
            tree = self.make_tree(base, changes)
        else:  # a root commit: its tree holds these files alone (each tree id checked)
            tree = self.tree_from_entries({c.path: c.entry for c in changes if c.entry})
        args = ("commit-tree", tree, "-F", "-", *(("-p", parent) if parent else ()))
        sha = self._commit_object(args, escape_undecodable(message).encode())
        self.update_branch(branch, sha, parent, "commit")
        return sha

    def check_out(self, branch: str) -> None:
        """Point HEAD at `branch` and fill the working tree: only for repositories we made."""
        self._git("checkout", "-q", "-f", branch)

    # -- the tree as a tar stream, built from objects --------------------------------------

    def blob_sizes(self, shas: list[str]) -> dict[str, int]:
        """Object sizes from one `cat-file --batch-check`, before any content is read (or none:
        a size this command read before is remembered, as it never changes)."""
        known = self._sizes
        sizes = {sha: found for sha in shas if (found := known.get(sha)) is not None}
        asked = [sha for sha in shas if sha not in sizes]
        if asked:
            out = self._git("cat-file", "--batch-check=%(objectname) %(objectsize)",
                            stdin=("\n".join(asked) + "\n").encode())
            for line in out.splitlines():
                name, _, size = line.partition(" ")
                if size.isdigit():
                    sizes[name] = int(size)
            if len(known) > TREES_KEPT:
                known.clear()
            known.update(sizes)
        return sizes

    def tree_tar(self, tree: str, max_file_size: int) -> TarStream:
        """`tree` as a tar stream built from git objects (no `.gitattributes` applied), produced
        as it is sent: the host holds one block of it at a time, never the tree. Sizes are
        checked first: a file over `max_file_size` stops here, before anything is read."""
        items = sorted((path, entry) for path, entry in self.ls_tree(tree).items()
                       if entry.mode in ("100644", "100755", "120000"))  # submodules: no content
        sizes = self.refuse_oversized([(path, entry.sha) for path, entry in items], max_file_size)
        return TarStream(self._tar_blocks(items, sizes), len(items))

    def refuse_oversized(self, blobs: list[tuple[str, str]], max_file_size: int,
                         where: str = "", then: str = "") -> dict[str, int]:
        """The sizes of the (path, blob) pairs' objects, from one `cat-file --batch-check`;
        a GitError naming the first path over `max_file_size` (`where`: on which revision;
        `then`: more of the hint), before any content is read."""
        sizes = self.blob_sizes(sorted({sha for _, sha in blobs}))
        for path, sha in blobs:
            if sizes.get(sha, 0) > max_file_size:
                raise GitError(f"{sanitize_name(path)} is {sizes[sha]} bytes{where}, over the "
                               f"largest file the host reads ({max_file_size} bytes)",
                               f"Raise [sandbox] max_file_size if you trust this repository.{then}")
        return sizes

    def _tar_blocks(self, items: list[tuple[str, TreeEntry]], sizes: dict[str, int]
                    ) -> Iterator[bytes]:
        pending = bytearray()
        for path, entry in items:
            info = tarfile.TarInfo(path)
            info.mtime = 0
            if entry.mode == "120000":
                info.type = tarfile.SYMTYPE
                info.linkname = self.blob(entry.sha).decode("utf-8", "surrogateescape")
                pending += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
                continue
            info.size = sizes[entry.sha]
            info.mode = 0o755 if entry.mode == "100755" else 0o644
            pending += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            if info.size <= TAR_BLOCK:
                pending += self.blob(entry.sha)
            else:
                yield bytes(pending)
                pending.clear()
                yield from self._blob_blocks(entry.sha)
            pending += b"\0" * (-info.size % tarfile.BLOCKSIZE)
            if len(pending) >= TAR_BLOCK:
                yield bytes(pending)
                pending.clear()
        pending += b"\0" * (2 * tarfile.BLOCKSIZE)
        yield bytes(pending)

    def _blob_blocks(self, sha: str) -> Iterator[bytes]:
        try:
            stream = self._repo.odb.stream(bytes.fromhex(sha))
            while block := stream.read(TAR_BLOCK):
                yield block
        except READ_ERRORS as exc:
            raise GitError(f"cannot read object {sha[:12]}: {_first_line(exc)}") from None

    # -- notes: where the verification cache lives (objects and a ref; never files) ---------

    def ref_sha(self, ref: str) -> str | None:
        """The commit a full ref name points at, or None if it does not exist."""
        try:
            return self._git("rev-parse", "--verify", "--quiet", "--end-of-options",
                             f"{ref}^{{commit}}")
        except GitError:
            return None

    def ref_state(self, ref: str) -> tuple[str | None, bool]:
        """`ref_sha` and `ref_exists` of a full ref name, from one git call where it can be:
        the commit it points at (None: none), and whether it points at any object at all."""
        try:
            out: str | None = self._git(
                "for-each-ref", "--format=%(objecttype) %(objectname) %(refname)",
                "--end-of-options", ref)
        except GitError:  # a ref to a missing object, say: asked as ever, to tell which
            out = None
        found = [line.split(" ", 2) for line in (out or "").splitlines()]
        kinds = [(f[0], f[1]) for f in found if len(f) == 3 and f[2] == ref]
        if out is None or any(kind == "tag" for kind, _ in kinds):  # rev-parse peels a tag
            commit = self.ref_sha(ref)
            return commit, commit is not None or self.ref_exists(ref)
        if not kinds:
            return None, False
        kind, sha = kinds[0]
        return (sha if kind == "commit" else None), True

    def ref_exists(self, ref: str) -> bool:
        """Whether a full ref name points at any object at all."""
        try:
            self._git("rev-parse", "--verify", "--quiet", "--end-of-options", ref)
        except GitError:
            return False
        return True

    def notes_at(self, notes_commit: str) -> dict[str, str]:
        """The notes of a notes commit: annotated object -> note blob (fan-out paths such as
        `ab/cdef…`, as `git notes` writes them in large trees, are joined). A tree holding
        anything else is not a notes tree: GitError. A dict of the caller's own."""
        return dict(self._of_object("notes", notes_commit,
                                    lambda: self._notes_at(notes_commit)))

    def _notes_at(self, notes_commit: str) -> dict[str, str]:
        out = self._git("ls-tree", "-r", "-z", "--full-tree", notes_commit, strip=False)
        notes: dict[str, str] = {}
        for record in out.split("\0"):
            if not record:
                continue
            meta, path = record.split("\t", 1)
            _mode, kind, sha = meta.split()
            *fanout, last = path.split("/")
            name = "".join([*fanout, last])
            if kind != "blob" or not _NOTE_NAME.fullmatch(name) or \
                    any(len(part) != 2 for part in fanout):
                raise GitError(f"it holds {sanitize_name(path)}, which is no note")
            notes[name] = sha
        return notes

    def small_blobs(self, shas: list[str], limit: int) -> dict[str, bytes]:
        """The content of each blob of `shas` of at most `limit` bytes (the others, and what is
        not a blob, left out): two git calls however many, not one round trip each."""
        wanted = list(dict.fromkeys(shas))
        if not wanted:
            return {}
        checked = self._git("cat-file", "--batch-check", stdin="\n".join(wanted).encode() + b"\n")
        small = [line.split()[0] for line in checked.splitlines()
                 if len(line.split()) == 3 and line.split()[1] == "blob"
                 and int(line.split()[2]) <= limit]
        if not small:
            return {}
        raw = self._run(("cat-file", "--batch"), "\n".join(small).encode() + b"\n", None,
                        False, False)
        data = raw if isinstance(raw, bytes) else raw.encode()
        out: dict[str, bytes] = {}
        at = 0
        for sha in small:
            end = data.index(b"\n", at)
            size = int(data[at:end].split()[2])
            out[sha] = data[end + 1:end + 1 + size]
            at = end + 1 + size + 1
        return out

    def small_blob(self, sha: str, limit: int) -> bytes | None:
        """A blob's content, or None when it is larger than `limit` bytes (or not a blob)."""
        try:
            info = self._repo.odb.info(bytes.fromhex(sha))
        except READ_ERRORS:
            return None
        if info.type != b"blob" or info.size > limit:
            return None
        return self.blob(sha)

    def write_note(self, ref: str, obj: str, blob: str, old: str | None, message: str
                   ) -> str | None:
        """Make the blob `blob` the note of `obj` under `ref`: one notes commit on top of `old`
        (None: the ref must not exist yet), built on a temporary index and moved by
        compare-and-swap. The new notes commit, or None when the ref is no longer at `old`."""
        # the note may sit at a fan-out path: remove every form, then write it flat
        records = [_index_record("/".join([obj[2 * i : 2 * i + 2] for i in range(n)]
                                          + [obj[2 * n :]]), None) for n in range(4)]
        records.append(_index_record(obj, TreeEntry("100644", blob)))
        with tempfile.TemporaryDirectory(prefix="retcon-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if old:
                self._git("read-tree", old, env=env)
            self._git("update-index", "-z", "--index-info", stdin=b"".join(records), env=env)
            tree = self._git("write-tree", env=env)
        args = ("commit-tree", tree, "-F", "-", *(("-p", old) if old else ()))
        new = self._commit_object(args, (message + "\n").encode())
        try:
            self._git("update-ref", "--no-deref", "-m", f"retcon-sandbox: {message}", ref, new,
                      old or ZERO)
        except GitError as exc:
            if self.ref_sha(ref) != old:
                return None  # another writer moved it: the caller reads again and retries
            raise GitError(f"cannot update {ref} ({exc.message})") from None
        return new

    def commits_in(self, tip: str, base: str | None) -> list[tuple[str, str, str]]:
        """(sha, tree, subject) of each commit in base..tip, oldest first; without a base, `tip`
        alone. Both are commit ids already resolved."""
        limit = ("-n", "1") if base is None else ()
        revs = (tip,) if base is None else (f"{base}..{tip}",)
        out = self._git("log", "--reverse", *limit, "--format=%H %T %s", "--end-of-options",
                        *revs)
        return [(line[:40], line[41:81], line[82:]) for line in out.split("\n") if line]

    # -- planning: what `plan` reads (never files, never the working tree) -----------------

    def current_branch(self) -> str | None:
        """The branch HEAD names, or None when HEAD is detached."""
        try:
            ref = self._git("symbolic-ref", "--quiet", "HEAD")
        except GitError:
            return None
        return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None

    def upstream_of(self, branch: str) -> str | None:
        """The short name of `branch`'s configured upstream (`origin/main`), if it has one."""
        try:
            name = self._git("rev-parse", "--verify", "--quiet", "--abbrev-ref",
                             "--symbolic-full-name", "--end-of-options", f"{branch}@{{upstream}}")
        except GitError:
            return None
        return name.splitlines()[-1] if name else None

    def diff_entries(self, old: str, new: str) -> list[tuple[str, str, str | None, str | None]]:
        """(path, status A/M/D, old blob, new blob) of each path that differs between two trees
        or commits; a type or mode change counts as M."""
        out = self._git("diff-tree", "-r", "-z", "--no-renames", old, new, strip=False)
        fields = out.split("\0")
        found: list[tuple[str, str, str | None, str | None]] = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            parts = meta.lstrip(":").split()
            if len(parts) == 5:
                status = parts[4][:1] if parts[4][:1] in "AD" else "M"
                found.append((path, status, None if parts[2] == ZERO else parts[2],
                              None if parts[3] == ZERO else parts[3]))
        return found

    def commit_changes(self, tip: str, base: str
                       ) -> list[tuple[str, str, list[tuple[str, str, str | None, str | None]]]]:
        """(id, subject, diff_entries against its first parent) of each commit in base..tip,
        oldest first: two git calls, however many commits."""
        out = self._git("log", "--reverse", "-z", "--format=%H %P%x01%s", "--end-of-options",
                        f"{base}..{tip}", strip=False)
        commits = [(head.split(" "), subject) for record in out.split("\0") if record
                   for head, _, subject in [record.partition("\x01")]]
        pairs = "".join(f"{ids[0]} {ids[1]}\n" for ids, _ in commits if len(ids) > 1)
        raw = self._git("diff-tree", "--stdin", "-r", "-z", "--no-renames",
                        stdin=pairs.encode(), strip=False) if pairs else ""
        entries: dict[str, list[tuple[str, str, str | None, str | None]]] = {}
        current: list[tuple[str, str, str | None, str | None]] = []
        fields = raw.split("\0")
        i = 0
        while i < len(fields):
            field = fields[i]
            if field.startswith(":") and i + 1 < len(fields):
                parts = field.lstrip(":").split()
                status = parts[4][:1] if parts[4][:1] in "AD" else "M"
                current.append((fields[i + 1], status, None if parts[2] == ZERO else parts[2],
                                None if parts[3] == ZERO else parts[3]))
                i += 2
                continue
            if field:
                current = entries.setdefault(field, [])
            i += 1
        return [(ids[0], subject, entries.get(ids[0], [])) for ids, subject in commits]

    def touched_paths(self, commit: str) -> list[str]:
        """The paths a commit changed against its first parent (none for a merge's other
        side, nothing for a root commit)."""
        parent = self.parent_of(commit)
        if parent is None:
            return []
        return [path for path, *_ in self.diff_entries(parent, commit)]

    def subjects(self, rev: str, count: int) -> list[str]:
        """The subjects of the last `count` commits reachable from `rev`, newest first."""
        out = self._git("log", f"-n{count}", "--no-merges", "--format=%s", "--end-of-options",
                        rev)
        return [line for line in out.splitlines() if line]


@dataclass(frozen=True)
class _Tree:
    sha: str
    mktree_input: bytes  # its entries as `git mktree -z --batch` reads them, and the separator


def _trees_of(entries: dict[str, TreeEntry], algorithm: str) -> list[_Tree]:
    """The tree objects holding `entries`, deepest first (the root last), each with the id
    git gives it (entries sorted as git sorts them: a directory as if its name ended in /)."""
    dirs: dict[str, dict[str, tuple[str, str]]] = {"": {}}
    for path, entry in entries.items():
        parent = path.rpartition("/")[0]
        folder = parent
        while folder not in dirs:
            dirs[folder] = {}
            folder = folder.rpartition("/")[0]
        dirs[parent][path.rpartition("/")[2]] = (entry.mode, entry.sha)
    trees = []
    for folder in sorted(dirs, key=lambda d: -(d.count("/") + 1 if d else 0)):
        items = sorted(((os.fsencode(name) + (b"/" if mode == "40000" else b""), name, mode, sha)
                        for name, (mode, sha) in dirs[folder].items()), key=lambda i: i[0])
        body = b"".join(mode.encode() + b" " + os.fsencode(name) + b"\0" + bytes.fromhex(sha)
                        for _, name, mode, sha in items)
        sha = hashlib.new(algorithm, b"tree %d\0" % len(body) + body).hexdigest()
        listing = b"".join(f"{mode.zfill(6)} {'tree' if mode == '40000' else 'blob'} {sha_}\t"
                           .encode() + os.fsencode(name) + b"\0"
                           for _, name, mode, sha_ in items)
        trees.append(_Tree(sha, listing + b"\0"))
        if folder:
            dirs[folder.rpartition("/")[0]][folder.rpartition("/")[2]] = ("40000", sha)
    return trees


class PendingTree:
    """A `git mktree --batch` under way; `result()` is the root tree's id, once every tree id
    git gave is the one computed on the host."""

    def __init__(self, process: Any, handle: IO[bytes], expected: list[str]) -> None:
        self._process = process  # GitPython's wrapper: it kills the process when collected
        self._proc: subprocess.Popen[bytes] = process.proc
        self._handle = handle
        self._expected = expected

    def result(self) -> str:
        try:
            out, err = self._proc.communicate()
        finally:
            self._handle.close()
        if self._proc.returncode:
            raise GitError("git mktree failed: " + err.decode("utf-8", "replace").strip()[-300:])
        if out.decode().split() != self._expected:
            raise GitError("the tree git wrote is not the one asked for",
                           "Nothing was used. Report this: a name may be one git rewrites.")
        return self._expected[-1]


class BlobBatch:
    """A running `git fast-import` fed blobs (`write`), each as `data <size>` and its bytes."""

    def __init__(self, proc: subprocess.Popen[bytes], algorithm: str) -> None:
        self._proc = proc
        self._algorithm = algorithm
        assert proc.stdin is not None
        self._stdin = proc.stdin
        self._pending = bytearray()  # small blobs gathered into large writes: few hand-offs
        with contextlib.suppress(OSError, AttributeError):  # a 1 MiB pipe where Linux allows
            fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, TAR_BLOCK)

    def write(self, size: int, chunks: Iterator[bytes]) -> str:
        """One blob of exactly `size` bytes from `chunks`, hashed as it passes; the object id.
        Should the chunks fail midway, the blob is completed with zeros first, so fast-import
        still sees a well-formed stream (and leaves no crash report); the error goes on."""
        digest = hashlib.new(self._algorithm, b"blob %d\0" % size)
        left = size
        try:
            self._send(b"blob\ndata %d\n" % size)
            for chunk in chunks:
                if len(chunk) > left:
                    raise GitError("a blob's stream is longer than its size")
                digest.update(chunk)
                self._send(chunk)
                left -= len(chunk)
            if left:
                raise GitError(f"a blob's stream ended {left} bytes short")
        finally:
            while left > 0:
                pad = min(left, TAR_BLOCK)
                self._send(b"\0" * pad)
                left -= pad
            self._send(b"\n")
        return digest.hexdigest()

    def _send(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= TAR_BLOCK:
            self._flush()

    def _flush(self) -> None:
        try:
            self._stdin.write(self._pending)
        except OSError as exc:
            raise GitError(f"git fast-import stopped: {exc}") from None
        self._pending.clear()

    def finish(self) -> None:
        with contextlib.suppress(GitError):
            self._flush()
        with contextlib.suppress(OSError):
            self._stdin.close()
        code = self._proc.wait()
        err = self._proc.stderr.read() if self._proc.stderr else b""
        if code:
            raise GitError("git fast-import failed: "
                           + err.decode("utf-8", "replace").strip()[-500:])


def _index_record(path: str, entry: TreeEntry | None) -> bytes:
    """One `update-index -z --index-info` record; the name's bytes exactly as git gave them."""
    mode, sha = (entry.mode, entry.sha) if entry else ("0", ZERO)
    return f"{mode} {sha}\t".encode() + os.fsencode(path) + b"\0"


def refuse_dotgit(path: str) -> None:
    """A name that git treats as `.git` on some filesystem is never committed: say so."""
    if any(dotgit_component(part) for part in path.split("/")):
        raise GitError(f"{sanitize_name(path)!s} is a name git treats as .git on some "
                       "filesystem (case, ignorable characters, `git~1`, trailing dots or "
                       "spaces); retcon-sandbox never commits it",
                       "Remove or rename it on the source branch, then rerun.")


def git_version() -> str:
    """The git GitPython runs (`git version 2.x`), for a crash log; what went wrong if none."""
    try:
        return str(git.Git().version()).strip()
    except (git.exc.GitError, OSError) as exc:
        return f"git not usable ({type(exc).__name__}: {str(exc).strip()[:200]})"


def _first_line(exc: BaseException) -> str:
    """What went wrong, in a line: a git command's own last words (its stderr), else the
    exception's first line (GitPython's span several, with the command)."""
    text = str(exc)
    if isinstance(exc, git.exc.CommandError) and str(exc.stderr or "").strip():
        text = str(exc.stderr).strip().removeprefix("stderr: ").strip("'\n ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1 if isinstance(exc, git.exc.CommandError) else 0][:300] if lines \
        else type(exc).__name__
