"""Where each commit's content came from. A reconstruction only moves content from the source
branch onto the base: every line a commit adds to a path should be a line of the source
branch's version of that path. A line found there is moved, whatever else the commit leaves out
(a partly applied file flags nothing). A line that is not was written by the model (or a fix):
how a prompt-injected model would slip in code and remove it later, unseen by the final tree
check. Always flagged, whatever their lines: a file that exists in neither the base nor the
source, a file that is not UTF-8 text (or holds a NUL) and a link or submodule, each unless it is
exactly as in the base or the source; a file over `LINE_CAP` bytes (on either side) is compared
whole, not by lines; a mode the base and the source do not give the path. Every run reports
these paths per commit; `--strict-provenance` makes such a commit stuck until a human has looked.

`invented` and `gate` are pure; `of_commits` reads the commits from git. The cost is linear in
the size of the paths a commit changes (a multiset of lines per path).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.spec.history import PROVENANCE_PREFIX
from retcon_sandbox.text import sanitize_name

PREFIX = PROVENANCE_PREFIX
LINE_CAP = 2 * 1024 * 1024  # bytes of a blob compared line by line; larger: compared whole
SHOWN = 120  # characters of the first invented line kept for the report

# Why a path is flagged, when it is not (only) for its invented lines.
NEW_FILE = "new file"    # in neither the base nor the source
BINARY = "binary"        # not UTF-8 text: compared whole
LARGE = "large"          # over LINE_CAP: compared whole
SPECIAL = "link"         # a symlink or submodule: compared whole
MODE = "mode"            # a mode neither the base nor the source gives the path


@dataclass(frozen=True)
class Invented:
    """One path's content found in neither the base nor the source."""

    path: str
    lines: int = 0   # lines added that the source's version of the path does not have
    first: str = ""  # the first of them, sanitised and cut to SHOWN characters
    why: str = ""    # NEW_FILE, BINARY, LARGE, SPECIAL, MODE, or "" (its lines only)

    def merged(self, later: Invented) -> Invented:
        return Invented(self.path, self.lines + later.lines, self.first or later.first,
                        self.why or later.why)


@dataclass(frozen=True)
class Provenance:
    novel: tuple[str, ...] = ()    # paths with content in neither the base nor the source
    foreign: tuple[str, ...] = ()  # of those, paths that exist in neither
    found: tuple[Invented, ...] = ()  # what each novel path holds (in the order of `novel`)

    def __bool__(self) -> bool:
        return bool(self.novel)


def lines_of(data: bytes) -> list[bytes]:
    """A blob's lines, without their newline (a carriage return stays part of its line)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def invented(new: bytes, old: bytes, source: bytes) -> tuple[int, bytes]:
    """How many lines `new` adds to `old` that `source` does not have (as multisets: a line
    the source has once may be added once), and the first of them."""
    new_lines = lines_of(new)
    extra = Counter(new_lines)
    extra.subtract(lines_of(old))
    extra.subtract(lines_of(source))
    count = sum(n for n in extra.values() if n > 0)
    first = next((line for line in new_lines if extra[line] > 0), b"") if count else b""
    return count, first


def is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


Reader = Callable[[TreeEntry | None], bytes | None]  # a blob's bytes (b"" for none); None: large


def judge(path: str, old: TreeEntry | None, new: TreeEntry | None,
          base: Mapping[str, TreeEntry], source: Mapping[str, TreeEntry],
          read: Reader) -> Invented | None:
    """What one change of `path` (old state to new) brings that the source does not have."""
    if new is None or new == source.get(path) or new == base.get(path):
        return None
    if path not in source and path not in base:
        return _found(path, read(new), read(None), b"", NEW_FILE)
    if new.mode not in ("100644", "100755"):
        return Invented(path, why=SPECIAL)
    modes = {e.mode for e in (source.get(path), base.get(path)) if e is not None}
    mode = MODE if new.mode not in modes else ""
    data, before = read(new), read(old if old is not None and old.mode != "160000" else None)
    theirs = read(source.get(path))
    if data is None or before is None or theirs is None:
        return Invented(path, why=LARGE)
    if not is_text(data):
        return Invented(path, why=BINARY)
    return _found(path, data, before, theirs, mode)


def _found(path: str, data: bytes | None, before: bytes | None, theirs: bytes,
           why: str) -> Invented | None:
    if data is None or before is None:
        return Invented(path, why=why or LARGE)
    if not is_text(data):
        return Invented(path, why=why or BINARY)
    count, first = invented(data, before, theirs)
    if not count and not why:
        return None
    shown = sanitize_name(first.decode("utf-8", "replace"))[:SHOWN]
    return Invented(path, count, shown, why)


def classify(changes: Iterable[tuple[str, TreeEntry | None, TreeEntry | None]],
             base: Mapping[str, TreeEntry], source: Mapping[str, TreeEntry],
             read: Reader) -> Provenance:
    """The changes (path, old state, new state; None: absent), judged and summed per path."""
    by_path: dict[str, Invented] = {}
    for path, old, new in changes:
        found = judge(path, old, new, base, source, read)
        if found is not None:
            by_path[path] = by_path[path].merged(found) if path in by_path else found
    novel = sorted(by_path)
    foreign = [p for p in novel if p not in base and p not in source]
    return Provenance(tuple(novel), tuple(foreign), tuple(by_path[p] for p in novel))


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
    cache: dict[str, bytes | None] = {}  # the same blobs recur (a commit's new state is the
    held = [0]                           # next one's old), within a bound

    def read(entry: TreeEntry | None) -> bytes | None:
        if entry is None:
            return b""
        if entry.sha not in cache:
            if held[0] > 16 * LINE_CAP:
                cache.clear()
                held[0] = 0
            data = cache[entry.sha] = repo.small_blob(entry.sha, LINE_CAP)
            held[0] += len(data or b"")
        return cache[entry.sha]

    changes: list[tuple[str, TreeEntry | None, TreeEntry | None]] = []
    for sha in commits:
        parent = repo.parent_of(sha)
        if parent is not None:
            changes += repo.tree_changes_from(parent, sha)
    return classify(changes, base, source, read)
