"""A tar stream: how a tree goes into a sandbox without being held in memory.

`gitrepo` produces one from git objects, block by block (sizes checked before any blob is
read); the sandbox transport sends each block as it comes, as a length-prefixed frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TarStream:
    chunks: Iterable[bytes]  # produced lazily; consumed once
    files: int  # regular files and symlinks in it


def of_bytes(data: bytes, files: int) -> TarStream:
    return TarStream((data,), files)
