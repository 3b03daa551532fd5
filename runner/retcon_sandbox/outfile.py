"""A file a command writes for the user besides the spec (`plan -o FILE`, `verify --junit
FILE`, `report -o FILE`, `--summary FILE`, `images export FILE`): checked before anything runs,
never written through a link, written atomically or appended to.

The name must be a regular file or nothing: a symbolic link (a `junit.xml` a branch ships,
pointing anywhere), a directory, a pipe, a device or a socket is refused, whatever the options,
before the command does its work, and again at the write. Its folder must take a new file: a
dry run makes and removes a temporary file beside it (so `/proc/junit.xml` or a read-only folder
is refused at once, not after the whole verification). The write goes to a temporary file in
that same folder (opened once, by descriptor, for both), fsynced, then renamed over the name
(replacing a regular file) or linked to it (a new file only): the name's old target is never
opened, and a reader never sees half a file. A summary is appended to instead (as `>>` would,
for GitHub's `$GITHUB_STEP_SUMMARY`), opened with O_NOFOLLOW | O_APPEND.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from retcon_sandbox.errors import RetconError, UsageError

NAME_BYTES = 200  # of the target's name in a temporary file's: ".<name>.XXXXXXXX.tmp"
_SPECIAL = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
            (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
            (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def unwritable(exc: OSError, directory: Path, elsewhere: str) -> str:
    """What to do when a file cannot be written in `directory` (`elsewhere`: how to write it in
    another place), for the cause `exc` gives."""
    return {errno.EROFS: f"it is on a read-only file system: {elsewhere}",
            errno.ENOSPC: "the disk is full: free some space",
            errno.EDQUOT: "your disk quota is used up: free some space",
            errno.ENAMETOOLONG: "its path is too long (with a temporary file's name beside it): "
                                "use a shorter path"}.get(
        exc.errno or 0, f"its directory {directory} must be one you can write")


@dataclass(frozen=True)
class OutFile:
    """`path`, named by the option `option` of `command`, which writes `what` there.
    `replace`: an existing regular file may be replaced (else it is refused: `exists_hint`).
    `error`: the kind of error a refusal is (its exit code)."""

    path: Path
    option: str
    command: str
    what: str
    replace: bool = True
    error: type[RetconError] = UsageError
    exists_hint: str = ""
    otherwise: str = ""  # how to do without the file, for a refusal's hint

    def check(self) -> None:
        """Before the command does its work: what `write` would refuse, refused now."""
        try:
            self._refuse_special()
            if not self.replace and os.path.lexists(self.path):
                raise self.error(f"{self.path} exists; {self.command} does not overwrite it",
                                 self.exists_hint)
            if not self.path.parent.is_dir():
                raise self.error(f"{self.option} {self.path}: not a file in an existing "
                                 f"directory ({self.path.parent} is not one)",
                                 f"Create it, or give another {self.option} FILE.")
            with self._folder() as folder:
                os.unlink(_temporary(folder, self.path.name, b""), dir_fd=folder)  # our own
        except OSError as exc:
            raise self.unwritten(exc) from None

    def write(self, data: bytes | IO[bytes]) -> None:
        """`data` at the path, atomically, never through a link (see the module): bytes, or a
        file read to its end (a large archive, never held in memory). OSError when the write
        fails; the error `check` gives when the name became something else since."""
        self._refuse_special()
        with self._folder() as folder:
            name = self.path.name
            tmp = _temporary(folder, name, data)
            try:
                if self.replace:
                    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                else:
                    try:
                        os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder,
                                follow_symlinks=False)
                    except FileExistsError:
                        raise self.error(f"{self.path} appeared while {self.command} was "
                                         "working; it is kept", self.exists_hint) from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder)  # our own temporary name, never anything else
            os.fsync(folder)

    def append(self, text: str) -> str | None:
        """Append `text` (made if missing, never through a link); why it could not be, or
        None: a summary that cannot be written is a warning, not the run's failure."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | \
            os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            return f"{self.path} was not written: {exc.strerror or exc}"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return f"{self.path} was not written: it is not a regular file"
            data = text.encode("utf-8", "surrogateescape")
            while data:
                data = data[os.write(fd, data):]
        except OSError as exc:
            return f"{self.path} was not written whole: {exc.strerror or exc}"
        finally:
            os.close(fd)
        return None

    def unwritten(self, exc: OSError) -> RetconError:
        why = unwritable(exc, self.path.parent, f"give {self.option} a file in a writable "
                                                "directory")
        return self.error(f"cannot write {self.option} {self.path}: {exc.strerror or exc}",
                          f"Nothing was written: {why}, then rerun{self.otherwise}.")

    def _refuse_special(self) -> None:
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISREG(mode):
            return
        kind = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
        raise self.error(f"{self.option} {self.path} is {kind}, not a regular file: "
                         f"{self.command} writes {self.what} and never replaces anything else "
                         "(nor writes through a link)",
                         f"Give {self.option} the name of a new file"
                         + (" or of a regular file to replace." if self.replace else "."))

    @contextlib.contextmanager
    def _folder(self) -> Iterator[int]:
        """The path's folder, opened once: the temporary file and the name are both in it."""
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            yield fd
        finally:
            os.close(fd)


def _temporary(folder: int, name: str, data: bytes | IO[bytes]) -> str:
    """A new file in `folder` holding `data`, fsynced, mode 0644 (less the umask): its name,
    which fits NAME_MAX whatever the length of `name`."""
    stem = os.fsencode(name)[:NAME_BYTES].decode("utf-8", "ignore")
    tmp = f".{stem}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                 dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            else:
                shutil.copyfileobj(data, handle, 1 << 20)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        raise
    return tmp


def summary(path: Path, command: str) -> OutFile:
    """`--summary FILE`: appended to (GitHub's `$GITHUB_STEP_SUMMARY` holds a job's steps)."""
    return OutFile(path, "--summary", command, "a Markdown job summary")
