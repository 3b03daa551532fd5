"""A tar stream: how a tree goes into a sandbox without being held in memory.

`gitrepo` produces one from git objects, block by block (sizes checked before any blob is
read); the sandbox transport sends each block as it comes, as a length-prefixed frame.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO


@dataclass(frozen=True)
class TarStream:
    chunks: Iterable[bytes]  # produced lazily; consumed once
    files: int  # regular files and symlinks in it


def of_bytes(data: bytes, files: int) -> TarStream:
    return TarStream((data,), files)


SPOOL_MEMORY = 8 * 1024 * 1024  # a spooled tar beyond this goes to a temporary file
SPOOL_BLOCK = 1024 * 1024


def spooled(tar: TarStream) -> TarStream:
    """`tar` read to its end now (what produces it, e.g. git, is done with when this returns)
    and kept in memory up to SPOOL_MEMORY, beyond in a temporary file: the copy is sent later,
    a block at a time, without holding what produced it."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # noqa: SIM115 - closed below
    try:
        for chunk in tar.chunks:
            spool.write(chunk)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return TarStream(_blocks(spool), tar.files)


def _blocks(spool: IO[bytes]) -> Iterator[bytes]:
    with spool:
        while block := spool.read(SPOOL_BLOCK):
            yield block
