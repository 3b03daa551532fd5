"""Files written for the user besides the spec: a job summary appended to (`--summary FILE`,
GitHub's `$GITHUB_STEP_SUMMARY`) and a report written whole (`report -o FILE`).

Each is checked before anything runs, and again when written: something that is not a regular
file (a symbolic link, a directory, a pipe, a device, a socket) is refused, never written
through or replaced. A whole file is written beside its target and linked (new) or renamed
(`--force`) into place, so a reader never sees half of it; an appended one is opened with
O_NOFOLLOW | O_APPEND, as `>>` would, without following a link.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path

from retcon_sandbox.errors import UsageError

_SPECIAL = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
            (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
            (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def _kind(path: Path) -> str | None:
    """What `path` is when it is there and not a regular file; None otherwise."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL if test(mode)), "not a regular file")


def check(path: Path, option: str, new: bool = False) -> None:
    """Before a run: `path` can be written (appended to, or with `new` made): it is no special
    file, and its directory exists and is writable. A usage error says why not."""
    hint = f"Give {option} the path of a regular file in a directory you can write."
    try:
        kind = _kind(path)
        if kind is not None:
            raise UsageError(f"{option} {path} is {kind}: it is never written through or "
                             "replaced", hint)
        if new and path.exists():
            raise UsageError(f"{option} {path} exists", "Give --force to replace it, or "
                             "another path.")
        if not path.parent.is_dir():
            raise UsageError(f"{option} {path}: {path.parent} is not a directory", hint)
        probe = path if path.exists() else path.parent
        if not os.access(probe, os.W_OK):
            raise UsageError(f"{option} {path}: {probe} is not writable (read-only, or not "
                             "yours)", hint)
    except OSError as exc:  # a name too long, a component not searchable
        raise UsageError(f"{option} {path}: {exc.strerror or exc}", hint) from None


def append(path: Path, text: str) -> str | None:
    """Append `text` to `path` (made if missing); why it could not be, or None."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        return f"{path} was not written: {exc.strerror or exc}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{path} was not written: it is not a regular file"
        data = text.encode("utf-8", "surrogateescape")
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:
        return f"{path} was not written whole: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def write(path: Path, data: bytes, force: bool) -> str | None:
    """Write `path` whole: a new file, or with `force` a regular file replaced; why it could not
    be, or None."""
    tmp = path.parent / f".{path.name[:200]}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        kind = _kind(path)
        if kind is not None:
            return f"{path} was not written: it is {kind} now"
        if force:
            os.replace(tmp, path)  # replaces the name, never writes through it
        else:
            os.link(tmp, path)
    except FileExistsError:
        return f"{path} was not written: it appeared meanwhile (kept)"
    except OSError as exc:
        return f"{path} was not written: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # our own temporary name, never anything else
    return None
