"""The run's own files (the spec's lock, the model transcript), kept under the repository's git
directory in `retcon-sandbox/`, never beside the spec where a checkout could plant symlinks.

The directory is created by us and checked to be a real directory of ours; files in it are opened
with O_NOFOLLOW, so neither a planted symlink nor a renamed file can redirect a write. Nothing is
ever unlinked here.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from retcon_sandbox.errors import RetconError

NAME = "retcon-sandbox"


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
        digest = hashlib.sha256(str(spec_real).encode("utf-8", "surrogateescape")).hexdigest()
        return f"{spec_real.stem}-{digest[:8]}"

    def lock_path(self, spec_real: Path) -> Path:
        return self.ensure() / f"{self.key(spec_real)}.lock"

    def transcript_path(self, spec_real: Path) -> Path:
        return self.ensure() / f"{self.key(spec_real)}.transcript.jsonl"


def open_append(path: Path) -> int:
    """A file descriptor for appending, never through a symlink."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                       os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise RetconError(f"cannot open {path} for appending: {exc.strerror}",
                          "It must be a regular file (not a symlink) you can write.") from None
