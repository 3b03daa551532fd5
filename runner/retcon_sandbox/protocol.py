"""The helper protocol: one frozen dataclass per request and per response, shared by both ends.

The host (`backends/api.py`) builds each request from these classes and reads each answer into
one, validated; the in-container helper (`sandbox/helper.py`) reads each request into one and
answers with one. A field the class does not have, a missing field or a value of the wrong type
is a `ProtocolError` that names the field.

One definition for both sides: the helper imports this module by name (so mypy checks it
against the same classes), and `resources.helper_source()` puts this module's text in place of
that import, so the container still gets one self-contained file. So this module is written for
the helper's interpreter too: standard library only, Python 3.8 syntax (ruff checks it as such).

The wire format: a request is one JSON line {"id": N, "op": NAME, ...its fields} (plus
"payload": BYTES or "chunked": true when data follows the line); an answer is one JSON line
{"ok": true, ...its fields, "id": N} or {"ok": false, "error": TEXT, "id": N}. A field marked
`omitted` is left out while it has its default, as the protocol always did.

`OutputCapture`, the head and tail a `run` answer carries, is here too: the helper captures a
command's output with it and the host a Docker exec's, so both cut output the same way.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable, TypeVar, Union

M = TypeVar("M")
ENVELOPE = ("id", "op", "ok", "error", "payload", "chunked")


class ProtocolError(ValueError):
    """A message that does not fit its class; the text names the field."""


def omitted(default: Any = None) -> Any:
    """A field that is left out of the message while it has its default."""
    return field(default=default, metadata={"omit": True})


# --- requests (host -> helper) ----------------------------------------------------------------


@dataclass(frozen=True)
class HelloRequest:
    """Who the helper runs as, and what it finds wrong with its sandbox."""

    OP = "hello"


@dataclass(frozen=True)
class ExtractRequest:
    """A tar of the tree follows, chunked. `record`: keep its names (for a setup's snapshot)."""

    OP = "extract"
    record: bool = omitted(False)


@dataclass(frozen=True)
class ReadRequest:
    OP = "read"
    path: str
    offset: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class WriteRequest:
    """The content follows as the payload. `mode`: git's (100644, 100755, 120000)."""

    OP = "write"
    path: str
    mode: str | None = None
    exact: bool = False


@dataclass(frozen=True)
class DeleteRequest:
    OP = "delete"
    path: str
    exact: bool = False


@dataclass(frozen=True)
class ListRequest:
    OP = "list"
    path: str | None = None


@dataclass(frozen=True)
class RunRequest:
    OP = "run"
    cmd: str
    timeout: float = 600.0
    env: dict[str, str] | None = None


@dataclass(frozen=True)
class ExportRequest:
    """Copy-out: the workspace's files (or only those at or under `paths`; a path that does not
    exist is left out) stream back after the answer as typed frames (see EXPORT_* below): the
    answer says how many files follow. `.git` directories are left out, as are FIFOs, sockets
    and devices; symlinks come as their target. A file over `max_size` is refused up front."""

    OP = "export"
    max_size: int
    paths: list[str] | None = None


@dataclass(frozen=True)
class ResetRequest:
    """Once a tree's commands are done (and again after the supervisor's `--wipe`): remove what
    the helper's uid may of the scratch file systems, and say how the sandbox differs from what
    it was when the helper started."""

    OP = "reset"


Request = Union[HelloRequest, ExtractRequest, ReadRequest, WriteRequest, DeleteRequest,
                ListRequest, RunRequest, ExportRequest, ResetRequest]
REQUESTS: dict[str, type[Request]] = {c.OP: c for c in (
    HelloRequest, ExtractRequest, ReadRequest, WriteRequest, DeleteRequest, ListRequest,
    RunRequest, ExportRequest, ResetRequest)}


# --- responses (helper -> host) ---------------------------------------------------------------


@dataclass(frozen=True)
class HelloResponse:
    uid: int
    python: str
    subreaper: bool
    dumpable: bool
    problems: list[str]


@dataclass(frozen=True)
class ExtractResponse:
    files: int


@dataclass(frozen=True)
class ReadResponse:
    """A page of a text file (`lines` in all, `start`..`end` shown, `more` after), or a note
    that the file is binary (then only `binary`, `size` and `text`)."""

    binary: bool
    size: int
    text: str
    lines: int | None = omitted()
    start: int | None = omitted()
    end: int | None = omitted()
    more: bool | None = omitted()


@dataclass(frozen=True)
class WriteResponse:
    """`status`: created, updated, unchanged or binary; the diff of a large rewrite."""

    status: str
    summary: str
    added: int | None = omitted()
    removed: int | None = omitted()
    diff: str | None = omitted()


@dataclass(frozen=True)
class DeleteResponse:
    summary: str


@dataclass(frozen=True)
class ListResponse:
    files: list[str]


@dataclass(frozen=True)
class RunResponse:
    exit_code: int
    timed_out: bool
    output: str
    total_bytes: int
    truncated: bool
    seconds: float


@dataclass(frozen=True)
class ExportResponse:
    """`files`: how many files the frame stream that follows this answer holds."""

    files: int


@dataclass(frozen=True)
class ResetResponse:
    """`left`: what differs from the sandbox as it started (none: it may take another tree)."""

    left: list[str]


# --- copy-out's frame stream (helper -> host, after an ExportResponse) --------------------------
# Each frame is a 4-byte big-endian length and that many bytes; its first byte says its type.
# Per file, one header frame, then data frames holding exactly its size; an empty frame ends the
# stream; an error frame (the helper could not read a file) ends it too.
EXPORT_HEADER = b"H"  # H, the git mode (6 ASCII digits), the size (8 bytes big-endian), the name
EXPORT_DATA = b"D"  # D, then up to EXPORT_CHUNK bytes of the current file
EXPORT_ERROR = b"E"  # E, then a UTF-8 message
EXPORT_CHUNK = 1 << 20
EXPORT_MODES = ("100644", "100755", "120000")
# The stream of frames itself travels in blocks, each a 4-byte big-endian length, a type and at
# most EXPORT_BLOCK bytes of the stream: as they are (R), or compressed by zlib (Z), when that
# makes them smaller. Fewer bytes through the container runtime's relay is what makes copy-out
# fast; a block that does not shrink is sent raw, and a few blocks after it too.
EXPORT_RAW = b"R"
EXPORT_PACKED = b"Z"
EXPORT_BLOCK = EXPORT_CHUNK + 64


def export_header(mode: str, size: int, name: bytes) -> bytes:
    body = EXPORT_HEADER + mode.encode("ascii") + size.to_bytes(8, "big") + name
    return len(body).to_bytes(4, "big") + body


def export_frame(kind: bytes, data: bytes) -> bytes:
    return (len(data) + 1).to_bytes(4, "big") + kind + data


# --- to and from the wire ---------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or isinstance(value, float)


def _maybe(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _is_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_string_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


# Each field's annotation, as written above, and what a value of it must be.
CHECKS: dict[str, Callable[[object], bool]] = {
    "str": _is_str, "int": _is_int, "bool": _is_bool, "float": _is_number,
    "str | None": _maybe(_is_str), "int | None": _maybe(_is_int), "bool | None": _maybe(_is_bool),
    "list[str]": _is_strings, "list[str] | None": _maybe(_is_strings),
    "dict[str, str] | None": _maybe(_is_string_map),
}


def to_wire(message: Any) -> dict[str, Any]:
    """The message's fields, as JSON values (an `omitted` field at its default left out)."""
    out: dict[str, Any] = {}
    for item in fields(message):
        value = getattr(message, item.name)
        if not (item.metadata.get("omit") and value == item.default):
            out[item.name] = value
    return out


def from_wire(cls: type[M], data: dict[str, Any]) -> M:
    """`data` (a message's fields, without the envelope) as a `cls`; ProtocolError naming the
    first field that is unknown, missing or of the wrong type."""
    known: dict[str, Field[Any]] = {item.name: item for item in fields(cls)}  # type: ignore[arg-type]
    for name in data:
        if name not in known:
            raise ProtocolError(f"unknown field {name!r}")
    values: dict[str, Any] = {}
    for name, item in known.items():
        if name not in data:
            if item.default is MISSING:
                raise ProtocolError(f"missing field {name!r}")
            continue
        value = data[name]
        kind = str(item.type)
        if not CHECKS[kind](value):
            raise ProtocolError(f"field {name!r} must be {kind}, not {type(value).__name__}")
        values[name] = float(value) if kind == "float" else value
    made: M = cls(**values)
    return made


# --- a command's output, on both sides ----------------------------------------------------

HEAD_BYTES = 24 * 1024
TAIL_BYTES = 24 * 1024


class OutputCapture:
    """The head and tail of a command's output and its total size, in linear time and bounded
    memory, however much is printed."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk[-TAIL_BYTES:]
            if len(self.tail) > 2 * TAIL_BYTES:
                del self.tail[: len(self.tail) - TAIL_BYTES]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), TAIL_BYTES)

    def text(self) -> str:
        tail = bytes(self.tail[-TAIL_BYTES:])
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            return head + tail.decode("utf-8", "replace")
        skipped = self.total - len(self.head) - len(tail)
        return (f"{head}\n[... {skipped} bytes of output omitted ...]\n"
                + tail.decode("utf-8", "replace"))
