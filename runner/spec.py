"""The history spec: the user's TOML file, and the run's only state.

Reading gives immutable values (`Spec`); writing only ever appends one history entry, re-reading
the file first so that whatever the user changed meanwhile is kept, and replacing it atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Array, InlineTable, Table

from runner.errors import ConcurrentEditError, LockedError, SpecError
from runner.history import (
    CommitCreated,
    Complete,
    Entry,
    Resolved,
    Response,
    Started,
    Stuck,
)
from runner.paths import PathRefused, repo_path

HEX40 = re.compile(r"^[0-9a-f]{40}$")
TABLE_ENTRIES = {"commit_created", "stuck", "resolved", "response"}
SANDBOX_KEYS = {
    "image": str,
    "build": str,
    "test": str,
    "memory": str,
    "cpus": float,
    "pids": int,
    "timeout": int,
    "workspace_size": str,
    "tmp_size": str,
    "env": list,
    "network": str,
}


@dataclass(frozen=True)
class SandboxSettings:
    image: str | None = None
    build: str | None = None
    test: str | None = None
    memory: str = "2g"
    cpus: float = 2.0
    pids: int = 512
    timeout: int = 600
    workspace_size: str = "2g"
    tmp_size: str = "512m"
    env: tuple[str, ...] = ()
    network: str = "none"


@dataclass(frozen=True)
class CommitSpec:
    number: int  # 1-based, as people count
    message: str
    hints: str
    paths: tuple[str, ...] | None
    history: tuple[Entry, ...]

    @property
    def subject(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


@dataclass(frozen=True)
class Spec:
    path: Path
    source: str
    remote: str
    cleaned: str
    sandbox: SandboxSettings
    commits: tuple[CommitSpec, ...] = field(default=())


# --- reading ------------------------------------------------------------------------------


def load(path: Path) -> Spec:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file", "Check the path, or run `retcon-sandbox prompt` "
                        "for how to write a spec.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    return parse(path, text)


def parse(path: Path, text: str) -> Spec:
    doc = _parse_doc(path, text)
    return _Validator(path).spec(doc)


def _parse_doc(path: Path, text: str) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise SpecError(f"{path.name}: line {exc.line}, column {exc.col}: not valid TOML "
                        f"({exc})") from None


class _Validator:
    def __init__(self, path: Path) -> None:
        self.name = path.name
        self.path = path

    def fail(self, where: str, expected: str) -> SpecError:
        return SpecError(f"{self.name}: {where}: {expected}")

    def string(self, table: Any, key: str, where: str, required: bool = True) -> str | None:
        if key not in table:
            if required:
                raise self.fail(where + key, "missing (expected a string)")
            return None
        value = table[key]
        if not isinstance(value, str):
            raise self.fail(where + key, "expected a string")
        return str(value)

    def spec(self, doc: tomlkit.TOMLDocument) -> Spec:
        names = {key: self.string(doc, key, "") or "" for key in ("source", "remote", "cleaned")}
        for key, value in names.items():
            if not value.strip():
                raise self.fail(key, "expected a branch name, got an empty string")
        if names["cleaned"] == names["source"]:
            raise self.fail("cleaned", "must differ from `source` (the source is never changed)")
        commits = doc.get("commit", [])
        if not isinstance(commits, (AoT, list)):
            raise self.fail("commit", "expected [[commit]] tables")
        parsed = tuple(self.commit(c, i + 1) for i, c in enumerate(commits))
        if not parsed:
            raise self.fail("[[commit]]", "no commits (add at least one [[commit]] table)")
        return Spec(self.path, names["source"], names["remote"], names["cleaned"],
                    self.sandbox(doc.get("sandbox")), parsed)

    def sandbox(self, table: Any) -> SandboxSettings:
        if table is None:
            return SandboxSettings()
        if not isinstance(table, (Table, dict)):
            raise self.fail("sandbox", "expected a table")
        values: dict[str, Any] = {}
        for key, value in table.items():
            kind = SANDBOX_KEYS.get(key)
            if kind is None:
                raise self.fail(f"[sandbox] → {key}",
                                f"unknown key (known: {', '.join(sorted(SANDBOX_KEYS))})")
            ok = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
            if not ok or (kind is int and isinstance(value, bool)):
                raise self.fail(f"[sandbox] → {key}", f"expected {_kind_name(kind)}")
            values[key] = _plain(value)
        if "env" in values:
            env = values["env"]
            if not all(isinstance(v, str) for v in env):
                raise self.fail("[sandbox] → env", "expected a list of variable names")
            values["env"] = tuple(env)
        if values.get("network", "none") != "none":
            raise self.fail("[sandbox] → network", 'only "none" is supported: sandboxes are '
                            "offline by design")
        return SandboxSettings(**values)

    def commit(self, table: Any, number: int) -> CommitSpec:
        where = f"[[commit]] #{number} → "
        if not isinstance(table, (Table, dict)):
            raise self.fail(where.rstrip(" →"), "expected a table")
        message = self.string(table, "message", where) or ""
        if not message.strip():
            raise self.fail(where + "message", "expected a non-empty commit message")
        hints = self.string(table, "hints", where, required=False) or ""
        paths: tuple[str, ...] | None = None
        if "paths" in table:
            raw = table["paths"]
            if not isinstance(raw, list):
                raise self.fail(where + "paths", "expected a list of strings")
            items = []
            for j, item in enumerate(raw):
                if not isinstance(item, str) or not item.strip():
                    raise self.fail(f"{where}paths[{j}]", "expected a string")
                try:
                    items.append(repo_path(str(item)))
                except PathRefused as exc:
                    raise self.fail(f"{where}paths[{j}]", str(exc)) from None
            paths = tuple(items)
        history = table.get("history", [])
        if not isinstance(history, list):
            raise self.fail(where + "history", "expected an array")
        entries = tuple(self.entry(e, f"{where}history[{j}]") for j, e in enumerate(history))
        return CommitSpec(number, str(message), str(hints), paths, entries)

    def entry(self, raw: Any, where: str) -> Entry:
        if isinstance(raw, str):
            if raw == "started":
                return Started()
            if raw == "complete":
                return Complete()
            raise self.fail(where, f'unknown entry "{raw}" (expected "started" or "complete")')
        if isinstance(raw, (InlineTable, Table, dict)) and len(raw) == 1:
            key, value = next(iter(raw.items()))
            if key in TABLE_ENTRIES and isinstance(value, str):
                return self.table_entry(key, str(value), where)
        raise self.fail(where, 'expected "started", "complete" or a table with one of '
                        + ", ".join(sorted(TABLE_ENTRIES)) + " (a string)")

    def table_entry(self, key: str, value: str, where: str) -> Entry:
        if key == "commit_created":
            if not HEX40.match(value):
                raise self.fail(where + " → commit_created", "expected a full 40-hex commit sha")
            return CommitCreated(value)
        if key == "stuck":
            return Stuck(value)
        if key == "resolved":
            return Resolved(value)
        return Response(value)


def _kind_name(kind: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", list: "a list"}[kind]


def _plain(value: Any) -> Any:
    if hasattr(value, "unwrap"):
        return value.unwrap()
    return value


# --- writing ------------------------------------------------------------------------------


def entry_item(entry: Entry) -> Any:
    """The TOML value for one history entry, formatted like the documentation shows it."""
    if isinstance(entry, Started):
        return "started"
    if isinstance(entry, Complete):
        return "complete"
    if isinstance(entry, CommitCreated):
        key, value = "commit_created", entry.sha
    elif isinstance(entry, Stuck):
        key, value = "stuck", entry.summary
    elif isinstance(entry, Resolved):
        key, value = "resolved", entry.note
    else:
        key, value = "response", entry.text
    snippet = f"x = {{ {key} = {tomlkit.string(value).as_string()} }}"
    return tomlkit.parse(snippet)["x"]


class SpecFile:
    """The spec on disk, locked for one run. Every change is one appended entry, saved at once."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()

    @contextlib.contextmanager
    def locked(self) -> Iterator[SpecFile]:
        """An exclusive lock beside the spec, released (and removed) when the run ends; a killed
        run's lock is released by the kernel."""
        lock_path = self.path.with_name(f".{self.path.name}.lock")
        fd = self._acquire(lock_path)
        try:
            yield self
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
            os.close(fd)

    def _acquire(self, lock_path: Path) -> int:
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise LockedError(f"{self.path.name} is in use by another retcon-sandbox run "
                                  f"(pid {owner})", "Wait for it to finish, or stop it."
                                  ) from None
            try:
                same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # else the holder removed it as we opened it: take the new one
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                return fd
            os.close(fd)

    def load(self) -> Spec:
        return load(self.path)

    def append(self, commit: CommitSpec, entry: Entry) -> tuple[Spec, CommitSpec]:
        """Append `entry` to `commit`'s history as the file is now on disk, and save atomically.

        The file is re-read first, so edits the user made during the run are kept. If the
        commit can no longer be found with the history we know, nothing is written.
        """
        text = self._read()
        doc = _parse_doc(self.path, text)
        try:
            current = _Validator(self.path).spec(doc)
        except SpecError as exc:
            raise self._conflict(entry, f"it no longer validates: {exc.message}") from None
        index = self._locate(current, commit, entry)
        table = doc["commit"][index]
        if "history" not in table:
            _add_history(table)
        history = table["history"]
        if isinstance(history, Array) and len(history) == 0:
            history.multiline(True)
        history.append(entry_item(entry))
        new_text = tomlkit.dumps(doc)
        spec = parse(self.path, new_text)
        atomic_write(self.path, new_text)
        return spec, spec.commits[index]

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConcurrentEditError(f"{self.path.name} can no longer be read: {exc}",
                                      "Restore the file and rerun; the run resumes from it."
                                      ) from None

    def _locate(self, current: Spec, commit: CommitSpec, entry: Entry) -> int:
        def fits(c: CommitSpec) -> bool:
            return c.message == commit.message and c.history[: len(commit.history)] == \
                commit.history
        i = commit.number - 1
        if i < len(current.commits) and fits(current.commits[i]):
            return i
        matches = [j for j, c in enumerate(current.commits) if fits(c)]
        if len(matches) == 1:
            return matches[0]
        raise self._conflict(entry, f"commit #{commit.number} ({commit.subject!r}) is no longer "
                             "there with the history this run knows")

    def _conflict(self, entry: Entry, why: str) -> ConcurrentEditError:
        return ConcurrentEditError(
            f"{self.path.name} was edited during the run and {why}; your edit is kept and "
            f"nothing was written",
            "The entry that was not recorded: "
            f"{tomlkit.dumps({'history': [entry_item(entry)]}).strip()} — fix the file and rerun "
            "to continue.",
        )


def _add_history(table: Table) -> None:
    """Add `history = []` right after the table's last key, so comments and blank lines that
    lead into the next table stay where the user put them."""
    array = tomlkit.array()
    array.multiline(True)
    keys = [key for key, _ in table.value.body if key is not None]
    if keys:
        table.value._insert_after(keys[-1], "history", array)
    else:
        table["history"] = array


def atomic_write(path: Path, text: str) -> None:
    """Temporary file beside the target, fsync, rename, fsync the directory."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
