"""The run's own files (the spec's lock, the model transcript, the events), kept under the
repository's git directory in `retcon-sandbox/`, never beside the spec where a checkout could
plant symlinks.

The directory is created by us and checked to be a real directory of ours; files in it are opened
with O_NOFOLLOW, so neither a planted symlink nor a renamed file can redirect a write. Nothing is
ever unlinked here but a file this run has just made.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import uuid
from pathlib import Path

from retcon_sandbox.errors import RetconError

NAME = "retcon-sandbox"
STEM_BYTES = 64  # of a spec's name in a state file's name ("<stem>-<hash>.transcript.jsonl")
SCOPE_FILE = "environment-scope"
STAMPS_FILE = "preflight-passed"  # the preflight checks that passed, one digest a line
STAMPS_LIMIT = 64 * 1024  # bytes of it read; a longer file starts over


class StateDir:
    def __init__(self, git_dir: Path) -> None:
        self.root = git_dir / NAME

    def ensure(self) -> Path:
        try:
            os.mkdir(self.root, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RetconError(f"cannot create {self.root}: {exc.strerror}") from None
        info = os.lstat(self.root)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise RetconError(f"{self.root} is not a directory of yours (a symlink, or another "
                              "user's)", f"Remove it (rm -r {self.root}) and rerun.")
        return self.root

    @staticmethod
    def key(spec_real: Path) -> str:
        """The spec's name in this directory: its stem, cut to STEM_BYTES bytes so that every
        file named after it fits a file name (NAME_MAX, 255 bytes), and a hash of its path."""
        digest = hashlib.sha256(os.fsencode(spec_real)).hexdigest()
        stem = spec_real.stem
        if len(os.fsencode(stem)) > STEM_BYTES:
            stem = os.fsencode(stem)[:STEM_BYTES].decode("utf-8", "ignore")
        return f"{stem}-{digest[:8]}"

    def lock_path(self, spec_real: Path) -> Path:
        return self.ensure() / f"{self.key(spec_real)}.lock"

    def transcript_path(self, spec_real: Path) -> Path:
        return self.ensure() / f"{self.key(spec_real)}.transcript.jsonl"

    def events_path(self, spec_real: Path) -> Path:
        """The runs' events, for `report` (see summary/runlog.py)."""
        return self.ensure() / f"{self.key(spec_real)}.events.jsonl"

    def existing(self, spec_real: Path, suffix: str) -> Path:
        """Where a state file of this spec is, without making the directory (for reading)."""
        return self.root / f"{self.key(spec_real)}.{suffix}"

    def scope(self) -> str:
        """A random id made once per repository: prepared environments are never shared with
        another repository, even one cloned later at the same path."""
        path = self.ensure() / SCOPE_FILE
        try:
            if not os.path.lexists(path):
                _publish(path, uuid.uuid4().hex.encode() + b"\n")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                text = os.read(fd, 64).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
        except OSError as exc:
            raise RetconError(f"cannot read or make {path}: {exc.strerror}",
                              "It must be a regular file (not a symlink) you can read.") from None
        if not re.fullmatch(r"[0-9a-f]{32}", text):
            raise RetconError(f"{path} is not a scope id retcon-sandbox wrote",
                              f"Remove it (rm {path}); prepared environments are made again.")
        return text

    def has_stamp(self, stamp: str) -> bool:
        """Whether `stamp` (a hex digest) was recorded by `add_stamp`. A file that cannot be
        read counts as none: a stamp only spares a check that runs otherwise."""
        try:
            fd = os.open(self.ensure() / STAMPS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, RetconError):
            return False
        try:
            data = os.read(fd, STAMPS_LIMIT)
        except OSError:
            return False
        finally:
            os.close(fd)
        return stamp.encode() in data.split(b"\n")

    def add_stamp(self, stamp: str) -> None:
        """Record `stamp`; a file grown past STAMPS_LIMIT starts over. Never an error."""
        path = self.ensure() / STAMPS_FILE
        try:
            full = os.lstat(path).st_size >= STAMPS_LIMIT
        except OSError:
            full = False
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | \
            (os.O_TRUNC if full else os.O_APPEND)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError:
            return
        try:
            os.write(fd, stamp.encode() + b"\n")
        except OSError:
            pass
        finally:
            os.close(fd)


def _publish(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a file of ours, linked into place (a concurrent run's
    file wins if it came first), then our own name for it removed."""
    made = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        os.link(made, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(made)


def open_append(path: Path) -> int:
    """A file descriptor for appending, never through a symlink."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                       os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise RetconError(f"cannot open {path} for appending: {exc.strerror}",
                          "It must be a regular file (not a symlink) you can write.") from None
