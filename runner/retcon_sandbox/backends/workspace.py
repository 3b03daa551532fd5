"""The working state of one logical commit: a base tree, plus the host's record of every change
made since. Commits are made from this record, never from the sandbox's files, so nothing a
build leaves behind can reach a commit.

The sandbox is opened on first use (a tool call, a command), holding the tree as recorded at
that moment; a step that needs no sandbox (a `paths` commit whose verification is cached) starts
no container at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from retcon_sandbox.backends.api import HelperSandbox, Sandbox, ToolFailure
from retcon_sandbox.errors import GitError
from retcon_sandbox.paths import PathRefused, not_unicode, parents, repo_path
from retcon_sandbox.repo.gitrepo import FileChange, PendingTree, Repo, TreeEntry
from retcon_sandbox.text import restore_undecodable

DIFF_CAP = 200_000
REGULAR = ("100644", "100755")
SYMLINK = "120000"


Opener = Callable[[str], Sandbox]  # a sandbox holding the given tree
EnvironmentKey = Callable[[str], str | None]  # the prepared environment a tree needs
# The sandbox's files now hold the given tree: what depends on the tree but is not a file of it
# (the git metadata) is made for it before the sandbox's next command (`Environments.retree`)
Retree = Callable[[Sandbox, str], None]


def copy_out(box: HelperSandbox, repo: Repo, max_file_size: int,
             paths: list[str] | None = None) -> dict[str, TreeEntry]:
    """The sandbox's files (or those at or under `paths`) as git blobs, streamed in one batch
    and checked as they come (backends/copyout.py): nothing is unpacked on the host. Never used
    for a commit: commits come from the host's record."""
    with repo.blob_batch() as batch:
        return {out.path: TreeEntry(out.mode, out.sha)
                for out in box.export(batch.write, max_file_size, paths)}


def sandbox_tree(box: HelperSandbox, repo: Repo, max_file_size: int) -> str:
    """The sandbox's whole workspace (but `.git`) as a git tree, as `copy_out` brings it; its
    tree objects are written while git finishes writing the blobs."""
    pending: PendingTree | None = None
    try:
        with repo.blob_batch() as batch:
            entries = {out.path: TreeEntry(out.mode, out.sha)
                       for out in box.export(batch.write, max_file_size)}
            pending = repo.start_tree(entries, blobs_pending=True)
    except BaseException:
        if pending is not None:  # the blobs failed: wait for git, and use nothing
            with contextlib.suppress(GitError):
                pending.result()
        raise
    assert pending is not None
    return pending.result()  # only once the batch has finished without error


class WorkState:
    def __init__(self, repo: Repo, opener: Opener, base_tree: str, source: str,
                 max_file_size: int, environment: EnvironmentKey | None = None,
                 retree: Retree | None = None) -> None:
        self.repo = repo
        self.max_file_size = max_file_size
        self._open = opener
        self._environment = environment
        self._retree = retree
        self._box: Sandbox | None = None
        self._box_environment: str | None = None
        self._box_tree: str | None = None  # the tree the sandbox was opened or retreed on
        self.base_tree = base_tree
        self.source = source
        self._base_entries = repo.ls_tree(base_tree)
        self._changes: dict[str, FileChange] = {}
        self._tree: str | None = None  # `tree()` until the record changes again
        self._source_names: set[str] | None = None
        # Every folder of the base tree or of a path written since: a superset of the recorded
        # tree's (a folder emptied since stays in it, which costs at most a new sandbox).
        self._folders: set[str] | None = None

    @property
    def box(self) -> Sandbox:
        """The sandbox, opened now if need be, holding the working tree as recorded."""
        if self._box is None:
            tree = self.tree()
            self._box_environment = self._environment(tree) if self._environment else None
            self._box = self._open(tree)
            self._box_tree = tree
        return self._box

    @property
    def command_box(self) -> Sandbox:
        """The sandbox for a build or test: a new one, holding the recorded tree, when the tree
        now needs another prepared environment than the open one (a dependency was added).
        When the files changed in place since it opened (`put`, the model's tools), it is
        retreed first: a command sees what it would see in a sandbox opened on the recorded
        tree, git metadata included."""
        if self._box is not None and self._environment is not None \
                and self._environment(self.tree()) != self._box_environment:
            self._box = None
        box = self.box
        tree = self.tree()
        if tree != self._box_tree:
            if self._retree is not None:
                self._retree(box, tree)
            self._box_tree = tree
        return box

    @property
    def opened(self) -> bool:
        return self._box is not None

    # -- the record -------------------------------------------------------------------------

    def changes(self) -> list[FileChange]:
        return list(self._changes.values())

    def tree(self) -> str:
        if self._tree is None:
            self._tree = self.repo.make_tree(self.base_tree, self.changes())
        return self._tree

    def committed(self, tree: str) -> None:
        """The record became a commit with `tree`: that is the new base."""
        self.base_tree = tree
        self._base_entries = self.repo.ls_tree(tree)
        self._changes.clear()
        self._tree = tree
        self._folders = None

    def _change(self, change: FileChange) -> None:
        self._changes[change.path] = change
        self._tree = None
        if self._folders is not None and change.entry is not None:
            self._folders.update(parents(change.path))

    def _mode(self, path: str) -> str:
        current = self._changes.get(path)
        entry = current.entry if current else self._base_entries.get(path)
        return entry.mode if entry and entry.mode == "100755" else "100644"

    # -- what the tools and the deterministic steps do ------------------------------------

    def put(self, path: str, entry: TreeEntry | None) -> None:
        """Set `path` to a blob already in the repository (or delete it): `paths` commits. An open
        sandbox gets the change too when it is one plain write or delete; after any other (a
        file's type changes, a submodule, a file where a folder was) it is let go, and the next
        use opens one holding the recorded tree, as a checkout of it would be."""
        if self._box is not None:
            if not self._plain(path, entry):
                self._box = None
            elif entry is None:
                self._box.delete_file(path, exact=True)
            else:
                self._box.write_file(path, self.repo.blob_chunks(entry.sha, self.max_file_size),
                                     entry.mode, exact=True)
        self._change(FileChange(path, entry))

    def _plain(self, path: str, entry: TreeEntry | None) -> bool:
        """Whether the open sandbox takes this change as one write or delete: a file or symlink
        written over a regular file or over nothing, or a regular file deleted, with no folder,
        symlink or submodule at the path or above it in the recorded tree."""
        old = self._entry(path)
        if old is None and entry is None:
            return False  # nothing recorded to delete: let the record decide
        if old is not None and old.mode not in REGULAR:
            return False
        if entry is not None and entry.mode not in (*REGULAR, SYMLINK):
            return False
        if any(self._entry(folder) is not None for folder in parents(path)):
            return False
        if old is not None:
            return True
        if self._folders is None:
            self._folders = {f for name in self._base_entries for f in parents(name)}
        return path not in self._folders

    def _entry(self, path: str) -> TreeEntry | None:
        if path in self._changes:
            return self._changes[path].entry
        return self._base_entries.get(path)

    def write_file(self, path: str, content: str) -> str:
        path = self._path(path)
        surrogate = not_unicode(content)
        if surrogate:
            raise ToolFailure(f"the content holds a lone surrogate ({surrogate}), which no UTF-8 "
                              "file can hold: write the character itself")
        data = content.encode("utf-8")
        mode = self._mode(path)
        result = self.box.write_file(path, data, mode)
        # Recorded even when the sandbox's copy already held these bytes: that copy is the
        # sandbox's (a build may have written it), the record is the host's.
        self._change(FileChange(path, TreeEntry(mode, self.repo.write_blob(data))))
        if result.diff:
            return f"{result.summary}\n{result.diff}"
        return result.summary

    def delete_file(self, path: str) -> str:
        path = self._path(path)
        summary = self.box.delete_file(path)
        self._change(FileChange(path, None))
        return summary

    def read_file(self, path: str, offset: int | None, limit: int | None) -> str:
        page = self.box.read_file(self._path(path), offset, limit)
        if not page.more or page.end is None:
            return page.text
        return (f"{page.text}[showing lines {page.start}-{page.end} of {page.lines}; call "
                f"read_file with offset={page.end + 1} to read on]")

    def list_files(self, path: str | None) -> str:
        files = self.box.list_files(self._path(path) if path else None)
        return "\n".join(files) if files else "(no files)"

    def _path(self, path: str) -> str:
        """A path the model gave, checked; a name shown to it with `\\xNN` for bytes that are
        not UTF-8 means that file, when the working state or the source branch has it."""
        checked = _checked(path)
        restored = restore_undecodable(checked)
        if restored == checked or self._known(checked):
            return checked
        return restored if self._known(restored) else checked

    def _known(self, path: str) -> bool:
        if path in self._changes or path in self._base_entries:
            return True
        if self._source_names is None:
            self._source_names = set(self.repo.ls_tree(self.repo.tree_of(self.source)))
        inside = path.rstrip("/") + "/"
        return path in self._source_names or any(
            name.startswith(inside) for name in (*self._base_entries, *self._source_names))

    def read_diff(self, path: str | None = None) -> str:
        paths = (self._path(path),) if path else ()
        diff = self.repo.diff(self.tree(), self.source, paths)
        if not diff:
            return "(no differences: the working state matches the source branch here)"
        if len(diff) > DIFF_CAP:
            return (diff[: DIFF_CAP // 2] + f"\n[... {len(diff) - DIFF_CAP} characters omitted: "
                    "call read_diff with a path ...]\n" + diff[-DIFF_CAP // 2 :])
        return diff


def _checked(path: str) -> str:
    try:
        return repo_path(path)
    except PathRefused as exc:
        raise ToolFailure(str(exc)) from None
