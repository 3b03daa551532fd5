"""The history spec: the user's TOML file, and the run's only state.

Reading gives immutable values (`Spec`), validated with key paths and did-you-mean suggestions.
Writing only ever appends one history entry, as a text splice that keeps every other byte of the
file (comments, layout, CRLF, a byte-order mark), checked by parsing the changed table again, and
saved atomically. The file is re-read before each append, so the user's edits during a run are
kept; while it is unchanged, an append costs a splice and a write, whatever the file's size.
Before a run writes anything, `check_appendable` dry-runs an append to each commit in memory and
`check_writable` makes (and removes) the temporary file a save needs, so a spec that could not
be saved is refused before the cleaned branch exists. Any str can be saved: a lone surrogate is
written U+FFFD (`storable`).
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import os
import re
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from retcon_sandbox.errors import ConcurrentEditError, LockedError, SpecError
from retcon_sandbox.outfile import unwritable
from retcon_sandbox.paths import PathRefused, pattern, repo_path
from retcon_sandbox.spec import tomltext
from retcon_sandbox.spec.history import (
    BY_KEY,
    KINDS,
    Done,
    Entry,
    Stuck,
    kind_of,
    next_step,
    sequence_problems,
    value_of,
)
from retcon_sandbox.spec.modeltable import COMMAND_LINE_ONLY, MODEL_KEYS, NO_MODEL, ModelTable
from retcon_sandbox.spec.settings import BY_KEY as SETTINGS
from retcon_sandbox.spec.settings import DEFAULTS, SandboxSettings, SettingError

BOM = "\ufeff"
TOP_KEYS = ("source", "remote", "cleaned", "sandbox", "model", "commit")
COMMIT_KEYS = ("message", "hints", "paths", "versions", "history")
COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True)
class CommitSpec:
    number: int  # 1-based, as people count
    message: str
    hints: str
    paths: tuple[str, ...] | None
    history: tuple[Entry, ...]
    # files taken as a commit of the source branch had them (the work so far), not whole
    versions: tuple[tuple[str, str], ...] = ()

    @property
    def subject(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


@dataclass(frozen=True)
class Spec:
    path: Path
    source: str
    remote: str
    cleaned: str
    sandbox: SandboxSettings = DEFAULTS
    commits: tuple[CommitSpec, ...] = field(default=())
    model: ModelTable = NO_MODEL


# --- reading ------------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """The file's text, byte-order mark included, as it must be written back."""
    return decode(path, read_bytes(path))


def read_bytes(path: Path) -> bytes:
    try:
        folder = path.parent.is_dir()
    except OSError as exc:  # a name too long, a folder that cannot be searched
        raise SpecError(f"{str(path)[:300]}: cannot read: {exc.strerror}",
                        "Check the path.") from None
    if not folder:
        raise SpecError(f"{path}: the directory {path.parent} does not exist",
                        "Check the path, or run `retcon-sandbox prompt` for how to write a spec.")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file", "Check the path, or run `retcon-sandbox "
                        "prompt` for how to write a spec.") from None
    except IsADirectoryError:
        raise SpecError(f"{path} is a directory, not a spec file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    return data


def decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path.name}: not UTF-8 text (byte {exc.start})",
                        "Save the spec as UTF-8.") from None


def load(path: Path) -> Spec:
    return parse(path, read_text(path))


def parse(path: Path, text: str) -> Spec:
    return _Validator(path).spec(_parse_doc(path, text))


def _parse_doc(path: Path, text: str) -> dict[str, Any]:
    try:
        return toml_loads(text.removeprefix(BOM))
    except TomlRefused as exc:
        raise SpecError(f"{path.name}: not valid TOML: {exc}", exc.hint) from None


class TomlRefused(ValueError):
    """Text tomllib cannot read, for any reason it has: the reason, and what to do (`hint`)."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.hint = hint


def toml_loads(text: str) -> dict[str, Any]:
    """`tomllib.loads`, whose every refusal is a TomlRefused: besides its syntax errors, it
    raises a bare ValueError for an integer of more than `sys.get_int_max_str_digits()` digits
    and RecursionError for arrays or inline tables nested a few hundred deep."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlRefused(str(exc)) from None
    except RecursionError:
        raise TomlRefused("arrays or inline tables nested too deeply to read",
                          "Nest them less deeply (a spec needs at most three levels).") from None
    except ValueError as exc:  # tomllib's own conversions: int() past the digit limit
        why = str(exc).split(";")[0]  # not its advice to call sys.set_int_max_str_digits()
        raise TomlRefused(f"a value that cannot be read ({why})",
                          "Shorten that number: no setting of a spec needs more than 20 "
                          "digits.") from None


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but \t and \n, DEL, C1
_SUBJECT_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _suggest(key: str, known: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


class _Validator:
    def __init__(self, path: Path) -> None:
        self.name = path.name
        self.path = path

    def fail(self, where: str, expected: str) -> SpecError:
        return SpecError(f"{self.name}: {where}: {expected}")

    def unknown(self, table: dict[str, Any], known: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in known:
                raise self.fail(f"{where}{key}", f"unknown key{_suggest(key, known)} "
                                f"(known: {', '.join(known)})")

    def string(self, table: dict[str, Any], key: str, where: str,
               required: bool = True) -> str | None:
        if key not in table:
            if required:
                raise self.fail(where + key, "missing (expected a string)")
            return None
        value = table[key]
        if not isinstance(value, str):
            raise self.fail(where + key, "expected a string")
        return value

    def printable(self, text: str, where: str, subject: bool) -> None:
        """No C0 or C1 control character (nor DEL) in a message or hints: they would reach the
        commit, the terminal and the model as they are. A body may hold newlines and tabs; a
        message's subject (its first line) neither."""
        for number, line in enumerate(text.split("\n"), 1):
            found = _CONTROL.search(line) if number > 1 or not subject else \
                _SUBJECT_CONTROL.search(line)
            if found:
                code = ord(found.group())
                part = "the subject (first line)" if number == 1 and subject else f"line {number}"
                allowed = "none" if number == 1 and subject else "only newlines and tabs"
                raise self.fail(where, f"control character U+{code:04X} in {part}, column "
                                f"{found.start() + 1} ({allowed} may appear there); remove it")

    def spec(self, doc: dict[str, Any]) -> Spec:
        self.unknown(doc, TOP_KEYS, "")
        names = {key: self.string(doc, key, "") or "" for key in ("source", "remote", "cleaned")}
        for key, value in names.items():
            if not value.strip():
                raise self.fail(key, "expected a branch name, got an empty string")
        if names["cleaned"].startswith("refs/"):
            short = names["cleaned"].removeprefix("refs/heads/")
            raise self.fail("cleaned", f"give the branch's name, not a ref: {short!r}")
        for key in ("source", "remote"):
            if names["cleaned"] == names[key]:
                raise self.fail("cleaned", f"must differ from `{key}` ({names[key]!r}): the "
                                "cleaned branch is rewritten, and the others are never touched")
        commits = doc.get("commit", [])
        if not isinstance(commits, list):
            raise self.fail("commit", "expected [[commit]] tables")
        parsed = tuple(self.commit(c, i + 1) for i, c in enumerate(commits))
        if not parsed:
            raise self.fail("[[commit]]", "no commits (add at least one [[commit]] table)")
        return Spec(self.path, names["source"], names["remote"], names["cleaned"],
                    self.sandbox(doc.get("sandbox")), parsed, self.model(doc.get("model")))

    def model(self, table: Any) -> ModelTable:
        if table is None:
            return NO_MODEL
        if not isinstance(table, dict):
            raise self.fail("model", "expected a table")
        self.unknown({k: v for k, v in table.items() if k not in COMMAND_LINE_ONLY},
                     MODEL_KEYS, "[model] → ")
        try:
            return ModelTable.parse(table)
        except SettingError as exc:
            key, message = exc.args
            raise self.fail(f"[model] → {key}", message) from None

    def sandbox(self, table: Any) -> SandboxSettings:
        if table is None:
            return DEFAULTS
        if not isinstance(table, dict):
            raise self.fail("sandbox", "expected a table")
        self.unknown(table, tuple(SETTINGS), "[sandbox] → ")
        try:
            settings = SandboxSettings.parse(table)
        except SettingError as exc:
            key, message = exc.args
            raise self.fail(f"[sandbox] → {key}", message) from None
        for item in settings.setup_inputs or ():
            self.path_pattern(item, "[sandbox] → setup_inputs")
        return settings

    def path_pattern(self, item: object, where: str) -> str:
        if not isinstance(item, str) or not item.strip():
            raise self.fail(where, "expected a path or pattern (a non-empty string)")
        try:
            return pattern(item)
        except PathRefused as exc:
            raise self.fail(where, str(exc)) from None

    def commit(self, table: Any, number: int) -> CommitSpec:
        where = f"[[commit]] #{number} → "
        if not isinstance(table, dict):
            raise self.fail(where.rstrip(" →"), "expected a table")
        self.unknown(table, COMMIT_KEYS, where)
        message = self.string(table, "message", where) or ""
        if not message.strip():
            raise self.fail(where + "message", "expected a non-empty commit message")
        hints = self.string(table, "hints", where, required=False) or ""
        self.printable(message, where + "message", subject=True)
        self.printable(hints, where + "hints", subject=False)
        paths: tuple[str, ...] | None = None
        if "paths" in table:
            raw = table["paths"]
            if not isinstance(raw, list):
                raise self.fail(where + "paths", "expected a list of paths or patterns")
            if not raw:
                raise self.fail(where + "paths", "is empty: list the paths this commit takes, "
                                "or remove `paths` to let the model extract it")
            paths = tuple(self.path_pattern(item, f"{where}paths[{j}]")
                          for j, item in enumerate(raw))
        history = table.get("history", [])
        if not isinstance(history, list):
            raise self.fail(where + "history", "expected an array")
        entries = tuple(self.entry(e, f"{where}history[{j}]") for j, e in enumerate(history))
        for problem in sequence_problems(entries):
            raise self.fail(where + problem.split(":")[0], problem.split(": ", 1)[1])
        return CommitSpec(number, message, hints, paths, entries,
                          self.versions(table, where, paths is not None))

    def versions(self, table: dict[str, Any], where: str, paths: bool
                 ) -> tuple[tuple[str, str], ...]:
        """`versions = { "path" = "<commit>" }`: each file as that commit of the source branch
        has it (a later commit takes it whole); with `paths` only, for no model is asked."""
        raw = table.get("versions")
        if raw is None:
            return ()
        if not isinstance(raw, dict) or not raw:
            raise self.fail(where + "versions", 'expected a table of paths and commit ids, '
                            'e.g. { "src/a.py" = "<40 hex digits>" }')
        if not paths:
            raise self.fail(where + "versions", "needs `paths` beside it: a commit the model "
                            "extracts takes what its hints say")
        out = []
        for path, commit in raw.items():
            try:
                exact = repo_path(path)
            except PathRefused as exc:
                raise self.fail(f"{where}versions → {path!r}", str(exc)) from None
            if not isinstance(commit, str) or not COMMIT_ID.fullmatch(commit):
                raise self.fail(f"{where}versions → {path!r}", "expected a full commit id "
                                "(40 or 64 lower-case hex digits) of the source branch")
            out.append((exact, commit))
        return tuple(out)

    def entry(self, raw: Any, where: str) -> Entry:
        bare = [k.key for k in KINDS if k.bare]
        tables = [k.key for k in KINDS if not k.bare]
        if isinstance(raw, str):
            kind = BY_KEY.get(raw)
            if kind is None or not kind.bare:
                raise self.fail(where, f"unknown entry {raw!r}{_suggest(raw, bare)} "
                                f"(expected {' or '.join(map(repr, bare))}, or a table)")
            return kind.make()
        if isinstance(raw, dict) and len(raw) == 1:
            key, value = next(iter(raw.items()))
            kind = BY_KEY.get(key)
            if kind is None or kind.bare:
                raise self.fail(where, f"unknown entry `{key}`{_suggest(key, tables)} "
                                f"(expected one of {', '.join(tables)})")
            if not isinstance(value, str) or (kind.pattern and not kind.pattern.fullmatch(value)):
                raise self.fail(f"{where} → {key}", f"expected {kind.expected}")
            return kind.make(value)
        raise self.fail(where, f"expected {' or '.join(map(repr, bare))}, or a table with one "
                        f"of {', '.join(tables)}")


# --- writing ------------------------------------------------------------------------------


def entry_toml(entry: Entry) -> str:
    """One history entry as TOML, formatted as the documentation shows it."""
    kind = kind_of(entry)
    if kind.bare:
        return f'"{kind.key}"'
    return f"{{ {kind.key} = {tomltext.basic_string(value_of(entry) or '')} }}"


def storable(entry: Entry) -> Entry:
    """`entry` as a UTF-8 spec can hold it: any lone surrogate in its text (a model's summary
    or reason, a note typed on a terminal that is not UTF-8) written U+FFFD
    (`tomltext.unicode_text`)."""
    value = value_of(entry)
    if value is None:
        return entry
    text = tomltext.unicode_text(value)
    return entry if text == value else kind_of(entry).make(text)


TEMPORARY_NAME_BYTES = 200  # of the target's name in a temporary file's: ".<name>.XXXXXXXX.tmp"


def temporary_beside(path: Path, data: bytes, mode: int) -> str:
    """A new temporary file beside `path` holding `data`, fsynced, with `mode`: its name. The
    name fits whatever the length of `path`'s own (NAME_MAX, 255 bytes)."""
    name = path.name
    if len(os.fsencode(name)) > TEMPORARY_NAME_BYTES:
        name = os.fsencode(name)[:TEMPORARY_NAME_BYTES].decode("utf-8", "ignore")
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # our own temporary file, never anything else
        raise
    return tmp


def sync_directory(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Temporary file beside the target, fsync, rename, fsync the directory."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    tmp = temporary_beside(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # our own temporary file, never anything else
        raise
    sync_directory(path.parent)


PROBE = Stuck("a dry run's entry")  # what `check_appendable` appends in memory


def _alone(text: str) -> dict[str, Any] | None:
    """A [[commit]] table's text read on its own, or None if it does not read."""
    try:
        table = toml_loads(text)["commit"][0]
    except (TomlRefused, KeyError, IndexError, TypeError):
        return None
    return table if isinstance(table, dict) else None


def _layout_problem(body: str, table: tomltext.CommitTable, whole: dict[str, Any]
                    ) -> str | None:
    """Why an entry cannot be spliced into this table's text, if it cannot: part of the commit
    is written elsewhere in the file, or its history under a key the scanner does not read."""
    alone = _alone(body[table.header : table.end])
    if alone != whole:
        return "part of the commit is written outside its [[commit]] table (a " \
               "[[commit.history]] table?)"
    if ("history" in whole) != (table.history is not None):
        return "its `history` key is spelled in a way retcon-sandbox does not follow (a " \
               "quoted or escaped key?)"
    return None


def _probe_problem(body: str, table: tomltext.CommitTable) -> str | None:
    """Why the table's text plus a PROBE entry does not read as the table plus that entry."""
    text = body[table.header : table.end]
    local = replace(tomltext.shifted(table, -table.header), end=len(text))
    appended = _alone(tomltext.apply(text, tomltext.insertion(text, local, entry_toml(PROBE))))
    before = _alone(text) or {}
    probe = {kind_of(PROBE).key: value_of(PROBE)}
    if appended != {**before, "history": [*before.get("history", []), probe]}:
        return "an entry appended to it would not read back as one more entry"
    return None


@dataclass
class _Known:
    """The file as this run last read or wrote it, and where its tables are."""

    text: str
    spec: Spec
    layout: tomltext.Layout
    data: bytes  # the text as bytes: an unchanged file is recognised without decoding it
    tables: list[dict[str, Any]]  # each [[commit]] as tomllib reads it from the whole file


class SpecFile:
    """The spec on disk. A symlink is followed: the file it points to is the one written."""

    def __init__(self, path: Path) -> None:
        self.path = path  # as the user named it, for messages
        self.real = Path(os.path.realpath(path))
        self._known: _Known | None = None

    def load(self) -> Spec:
        return self._read().spec

    def _read(self) -> _Known:
        data = read_bytes(self.real)
        if self._known is not None and data == self._known.data:
            return self._known
        text = decode(self.real, data)
        doc = _parse_doc(self.path, text)
        spec = replace(_Validator(self.path).spec(doc), path=self.path)
        layout = self._scan(text.removeprefix(BOM))
        if len(layout.commits) != len(spec.commits):
            raise SpecError(f"{self.path.name}: write each commit as its own [[commit]] table "
                            "(inline arrays of commits cannot be appended to)")
        self._known = _Known(text, spec, layout, data, list(doc["commit"]))
        return self._known

    def _scan(self, body: str) -> tomltext.Layout:
        try:
            return tomltext.scan(body)
        except RecursionError:
            raise SpecError(f"{self.path.name}: arrays or inline tables nested too deeply for "
                            "retcon-sandbox to append to", "Nest them less deeply.") from None
        except tomltext.TomlScanError as exc:
            raise SpecError(f"{self.path.name}: {exc}: retcon-sandbox cannot append to this "
                            "layout", "Write each commit as a [[commit]] table.") from None

    def check_writable(self) -> None:
        """Before a run writes anything, when it may append (a commit is not done): a save can
        make its temporary file beside the spec (the directory is writable, on a file system
        that is not read-only, and the name fits) to replace the spec with. Nothing is left
        behind."""
        if all(isinstance(next_step(c.history), Done) for c in self._read().spec.commits):
            return
        try:
            tmp = temporary_beside(self.real, b"", 0o600)
        except OSError as exc:
            raise self._unsaved(exc, "Nothing was written.") from None
        os.unlink(tmp)  # our own temporary file, just made

    def _unsaved(self, exc: OSError, then: str) -> SpecError:
        why = unwritable(exc, self.real.parent, "copy it (and run with the copy) somewhere "
                         "writable")
        return SpecError(f"cannot save {self.path}: {exc.strerror or exc}",
                         f"Each step is saved to the spec as it is made, so {why}, then rerun. "
                         f"{then}")

    def check_appendable(self) -> None:
        """Before a run writes anything: an entry appended to the history of any commit a run
        may still append to (one not done), as the file is written now, must read back as that
        commit plus the entry (a dry run in memory). Raises a SpecError saying how to write the
        history if not."""
        known = self._read()
        body = known.text.removeprefix(BOM)
        for commit, table, whole in zip(known.spec.commits, known.layout.commits, known.tables,
                                        strict=True):
            if isinstance(next_step(commit.history), Done):
                continue
            why = _layout_problem(body, table, whole) or _probe_problem(body, table)
            if why:
                raise SpecError(
                    f"{self.path.name}: [[commit]] #{commit.number} ({commit.subject!r}): "
                    f"retcon-sandbox cannot append to its history as written: {why}",
                    "Write each commit's history inside its [[commit]] table as `history = "
                    "[...]`, with the key spelled plainly (not [[commit.history]] tables, nor a "
                    "quoted or escaped key), or leave it out while it is empty. Nothing was "
                    "written.")

    @contextlib.contextmanager
    def locked(self, lock_path: Path) -> Iterator[SpecFile]:
        """An exclusive lock for one run. The lock file lives with the run's own state (see
        `statedir`); it is never removed, and a killed run's lock is released by the kernel."""
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError as exc:
            hint = f"It must be a regular file of yours: remove it (rm -r {lock_path}) and " \
                "rerun." if os.path.lexists(lock_path) else \
                f"{lock_path.parent} must be a directory you can write."
            raise LockedError(f"cannot open the lock file {lock_path}: {exc.strerror}",
                              hint) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise LockedError(f"{self.path.name} is in use by another retcon-sandbox run "
                                  f"(pid {owner})", "Wait for it to finish, or stop it.") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield self
        finally:
            os.close(fd)

    def append(self, commit: CommitSpec, entry: Entry) -> tuple[Spec, CommitSpec]:
        """Append `entry` to `commit`'s history as the file is now on disk, and save atomically.
        If the commit can no longer be found with the history we know, nothing is written.
        The entry is recorded as the file can hold it (`storable`): the returned commit has it
        so."""
        entry = storable(entry)
        try:
            known = self._read()
        except SpecError as exc:
            raise self._conflict(entry, f"it no longer validates: {exc.message}") from None
        index = self._locate(known.spec, commit, entry)
        table = known.layout.commits[index]
        body = known.text.removeprefix(BOM)
        why = _layout_problem(body, table, known.tables[index])
        if why:
            raise self._conflict(entry, f"its history cannot be appended to as written ({why})")
        splices = tomltext.insertion(body, table, entry_toml(entry))
        new_body = tomltext.apply(body, splices)
        delta = len(new_body) - len(body)
        updated, read = self._checked(known.spec.commits[index], entry, body, new_body, table,
                                      delta)
        new_text = (BOM if known.text.startswith(BOM) else "") + new_body
        new_data = new_text.encode("utf-8")
        try:
            atomic_write(self.real, new_data)
        except OSError as exc:
            raise self._unsaved(exc, f"The entry that was not recorded: history = [..., "
                                f"{entry_toml(entry)}]") from None
        commits = list(known.spec.commits)
        commits[index] = updated
        spec = replace(known.spec, commits=tuple(commits))
        rescanned = tomltext.scan(new_body, table.header, table.end + delta).commits[0]
        tables = [*known.layout.commits[:index], rescanned,
                  *(tomltext.shifted(t, delta) for t in known.layout.commits[index + 1:])]
        read_tables = list(known.tables)
        read_tables[index] = read
        self._known = _Known(new_text, spec, tomltext.Layout(tuple(tables)), new_data,
                             read_tables)
        return spec, updated

    def _checked(self, commit: CommitSpec, entry: Entry, body: str, new_body: str,
                 table: tomltext.CommitTable, delta: int) -> tuple[CommitSpec, dict[str, Any]]:
        """Parse the changed table again: it must be the old one plus exactly this entry.
        Returns the commit, and the table as tomllib reads it."""
        validator = _Validator(self.path)
        try:
            old = toml_loads(body[table.header : table.end])["commit"][0]
            new = toml_loads(new_body[table.header : table.end + delta])["commit"][0]
            updated = validator.commit(new, commit.number)
        except (TomlRefused, SpecError, KeyError, IndexError) as exc:
            raise self._conflict(entry, f"the entry could not be added safely ({exc})") from None
        old_history = old.get("history", [])
        if {**old, "history": [*old_history, new["history"][-1]]} != new or \
                updated.history != (*commit.history, entry):
            raise self._conflict(entry, "the entry could not be added safely")
        return updated, new

    def _locate(self, current: Spec, commit: CommitSpec, entry: Entry) -> int:
        def fits(c: CommitSpec) -> bool:
            return c.message == commit.message and \
                c.history[: len(commit.history)] == commit.history
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
            f"The entry that was not recorded: history = [..., {entry_toml(entry)}] — fix the "
            "file and rerun to continue.")
