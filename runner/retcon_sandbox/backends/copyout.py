"""Copy-out's frame stream, read on the host: strictly, incrementally, never onto disk.

After an `ExportResponse` the helper sends typed frames (protocol.EXPORT_*): per file a header
(mode, size, name), then data frames holding exactly its size; an empty frame ends the stream.
The stream travels in blocks, raw or zlib-compressed, each inflated with a cap (`Blocks`).
Everything in it is untrusted. Each header is checked before a byte of its file is taken: a
known mode, a size within the limit, a name that is relative, normalised, UTF-8 or not but
without NUL, control characters are kept (they are repository names) but `..`, empty and `.`
components, `.git` look-alikes, a duplicate, or a name that is both a file and a directory are
refused. The file's bytes go to a sink (a git blob writer) as they arrive; the host never holds
more than one frame, and never writes anything but the sink's objects. Any departure from the
format (an unknown frame, a frame too long, a file longer or shorter than its header said, a
stream cut short, more or fewer files than announced) is a SandboxError, and nothing the sink
wrote is used.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from retcon_sandbox.errors import SandboxError
from retcon_sandbox.paths import dotgit_component, parents
from retcon_sandbox.protocol import (
    EXPORT_BLOCK,
    EXPORT_CHUNK,
    EXPORT_DATA,
    EXPORT_ERROR,
    EXPORT_HEADER,
    EXPORT_MODES,
    EXPORT_PACKED,
    EXPORT_RAW,
)
from retcon_sandbox.text import sanitize_name

FRAME_MAX = EXPORT_CHUNK + 1  # a data frame's type byte and a full chunk
NAME_MAX = 4096  # bytes in one name
LINK_MAX = 4096  # bytes in one symlink target

Read = Callable[[int], bytes]  # exactly n bytes, or fewer at the end of the stream
Sink = Callable[[int, Iterator[bytes]], str]  # (size, the bytes as they come) -> object id


@dataclass(frozen=True)
class OutFile:
    path: str
    mode: str
    sha: str


def refused(what: str) -> SandboxError:
    return SandboxError(f"the sandbox's copy-out stream was refused: {what}",
                        "Something in the sandbox wrote to the helper's output, or the helper "
                        "is not this version's; nothing from the stream was used.")


class Blocks:
    """The frames' stream out of its blocks (raw or zlib; see EXPORT_RAW): `read(n)` gives
    exactly n bytes of it, fewer at its end. A block of an unknown type, empty, over
    EXPORT_BLOCK (once inflated, too: inflation stops there), or not one whole zlib stream, is
    refused."""

    def __init__(self, read: Read) -> None:
        self._read = read
        self._block = b""
        self._at = 0

    def read(self, n: int) -> bytes:
        pieces: list[bytes] = []
        while n > 0:
            if self._at >= len(self._block) and not self._next():
                break
            piece = self._block[self._at : self._at + n]
            self._at += len(piece)
            n -= len(piece)
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _next(self) -> bool:
        head = self._read(4)
        size = int.from_bytes(head, "big")
        if len(head) < 4 or size == 0:
            return False
        if size > EXPORT_BLOCK + 1:
            raise refused(f"a block of {size} bytes (at most {EXPORT_BLOCK + 1})")
        body = self._read(size)
        if len(body) < size:
            return False
        kind, data = body[:1], body[1:]
        if kind == EXPORT_PACKED:
            inflate = zlib.decompressobj()
            try:
                data = inflate.decompress(data, EXPORT_BLOCK + 1)
            except zlib.error:
                raise refused("a compressed block that is not zlib") from None
            if len(data) > EXPORT_BLOCK or not inflate.eof or inflate.unused_data:
                raise refused("a compressed block that inflates past its limit, or is not "
                              "one whole zlib stream")
        elif kind != EXPORT_RAW:
            raise refused(f"a block of type {kind!r}")
        if not data:
            raise refused("an empty block")
        self._block, self._at = data, 0
        return True


class ExportReader:
    """One copy-out stream: `files()` yields each file once its bytes are in the sink."""

    def __init__(self, read: Read, announced: int, max_size: int, sink: Sink) -> None:
        self._read = Blocks(read).read
        self._announced = announced
        self._max_size = max_size
        self._sink = sink
        self._names: set[str] = set()
        self._dirs: set[str] = set()

    def files(self) -> Iterator[OutFile]:
        count = 0
        while True:
            frame = self._frame()
            if not frame:
                break
            if frame[:1] == EXPORT_ERROR:
                raise SandboxError("the sandbox could not copy a file out: "
                                   + sanitize_name(frame[1:].decode("utf-8", "replace")[:500]))
            if frame[:1] != EXPORT_HEADER:
                raise refused(f"a {frame[:1]!r} frame where a file's header was expected")
            count += 1
            if count > self._announced:
                raise refused(f"more files than the {self._announced} announced")
            mode, size, path = self._header(frame)
            body = self._body(path, size)
            sha = self._sink(size, body)
            for _ in body:  # what the sink left unread is still checked, never kept
                pass
            yield OutFile(path, mode, sha)
        if count != self._announced:
            raise refused(f"{count} files where {self._announced} were announced")

    def _frame(self) -> bytes:
        head = self._read(4)
        if len(head) < 4:
            raise refused("the stream was cut short")
        size = int.from_bytes(head, "big")
        if size > FRAME_MAX:
            raise refused(f"a frame of {size} bytes (at most {FRAME_MAX})")
        body = self._read(size)
        if len(body) < size:
            raise refused("the stream was cut short inside a frame")
        return body

    def _header(self, frame: bytes) -> tuple[str, int, str]:
        if len(frame) < 15:
            raise refused("a file header too short to hold a mode and a size")
        mode = frame[1:7].decode("ascii", "replace")
        size = int.from_bytes(frame[7:15], "big")
        path = self._name(frame[15:])
        if mode not in EXPORT_MODES:
            raise refused(f"{sanitize_name(path)} has mode {mode!r}")
        limit = LINK_MAX if mode == "120000" else self._max_size
        if size > limit:
            raise SandboxError(f"{sanitize_name(path)} in the sandbox is {size} bytes, over the "
                               f"largest file the host takes ({limit} bytes); nothing was "
                               "copied out",
                               "Raise [sandbox] max_file_size if you trust this repository.")
        return mode, size, path

    def _name(self, raw: bytes) -> str:
        if not raw or len(raw) > NAME_MAX or b"\0" in raw:
            raise refused(f"a file name that is empty, over {NAME_MAX} bytes or holds a NUL")
        path = raw.decode("utf-8", "surrogateescape")
        parts = path.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise refused(f"the name {sanitize_name(path)} is absolute, not normalised or "
                          "climbs out")
        if any(dotgit_component(part) for part in parts):
            raise refused(f"the name {sanitize_name(path)} is one git treats as .git")
        if path in self._names or path in self._dirs:
            raise refused(f"the name {sanitize_name(path)} comes twice, or as a file and a "
                          "directory")
        folders = parents(path)
        if any(folder in self._names for folder in folders):
            raise refused(f"the name {sanitize_name(path)} is under a name that is a file")
        self._names.add(path)
        self._dirs.update(folders)
        return path

    def _body(self, path: str, size: int) -> Iterator[bytes]:
        left = size
        while left:
            frame = self._frame()
            if frame[:1] != EXPORT_DATA:
                raise refused(f"{sanitize_name(path)} ended {left} bytes short of its size")
            if len(frame) == 1 or len(frame) - 1 > left:
                raise refused(f"{sanitize_name(path)} has an empty data frame, or is longer "
                              "than its size")
            left -= len(frame) - 1
            yield frame[1:]
