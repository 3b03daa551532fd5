"""A tar stream of known length: how a tree goes into a sandbox without being held in memory.

`gitrepo` produces one from git objects (sizes checked before any blob is read); the sandbox
transport sends its chunks after a request that announces `size` bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TarStream:
    size: int  # the exact number of bytes `chunks` yields
    chunks: Iterable[bytes]
    files: int  # regular files and symlinks in it


def of_bytes(data: bytes, files: int) -> TarStream:
    return TarStream(len(data), (data,), files)
