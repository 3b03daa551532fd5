"""The sandbox interface: how commands and file tools run, whatever runs the sandbox.

`Sandbox` is what the loop uses. `HelperSandbox` implements it by speaking the helper's JSON-line
protocol over a `Transport`; the backends (a Docker container, or a local directory for tests)
differ only in how they start the helper and move bytes to and from it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from retcon_sandbox import deadlines
from retcon_sandbox.archive import TarStream
from retcon_sandbox.backends.copyout import ExportReader, OutFile, Sink
from retcon_sandbox.errors import SandboxError
from retcon_sandbox.protocol import (
    DeleteRequest,
    DeleteResponse,
    ExportRequest,
    ExportResponse,
    ExtractRequest,
    ExtractResponse,
    HelloRequest,
    HelloResponse,
    ListRequest,
    ListResponse,
    ProtocolError,
    ReadRequest,
    ReadResponse,
    Request,
    ResetRequest,
    ResetResponse,
    RunRequest,
    RunResponse,
    WriteRequest,
    WriteResponse,
    from_wire,
    to_wire,
)

if TYPE_CHECKING:
    from retcon_sandbox.backends.envkeys import Version
    from retcon_sandbox.backends.hostaccess import SetupPolicy
    from retcon_sandbox.repo.gitrepo import Repo
    from retcon_sandbox.report import Reporter
    from retcon_sandbox.spec.settings import SandboxSettings

Answer = TypeVar("Answer")


class ToolFailure(Exception):
    """A file tool or command was refused or failed in a way the model can act on."""


class DeadlineExceeded(SandboxError):
    """The sandbox did not answer in time: the caller removes the container."""


# Host-side deadlines: a file tool must answer in FILE_TOOL_S, a tree must load in LOAD_S; a
# command gets its own timeout plus COMMAND_MARGIN_S before the host kills what it started.
FILE_TOOL_S = 60.0
LOAD_S = 600.0
COMMAND_MARGIN_S = 15.0
LINE_CAP = 32 * 1024 * 1024  # the longest answer line the host accepts from the helper


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    timed_out: bool
    output: str
    total_bytes: int
    truncated: bool
    seconds: float

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def verdict(self) -> str:
        if self.timed_out:
            return f"FAIL (timed out after {self.seconds:.0f}s)"
        if self.passed:
            return "PASS"
        if self.exit_code < 0:
            return f"FAIL (killed by signal {-self.exit_code})"
        return f"FAIL (exit {self.exit_code})"


@dataclass(frozen=True)
class ReadResult:
    text: str
    binary: bool
    lines: int | None
    start: int | None = None
    end: int | None = None
    more: bool = False


@dataclass(frozen=True)
class WriteResult:
    status: str  # created | updated | unchanged | binary
    summary: str
    diff: str | None


class Transport(Protocol):
    def set_deadline(self, deadline: float | None) -> None:
        """Until the next call: sends and reads past `deadline` (monotonic) raise
        DeadlineExceeded."""
        ...

    def send(self, data: bytes) -> None: ...
    def readline(self) -> bytes:
        """One line (newline included); b"" at end of stream. Longer than LINE_CAP: SandboxError."""
        ...

    def read(self, n: int) -> bytes:
        """Exactly `n` bytes (fewer only at end of stream): copy-out's frames."""
        ...

    def close(self) -> None: ...
    def describe_failure(self) -> str: ...


class Sandbox(Protocol):
    def load_tree(self, tar: TarStream) -> int: ...
    def read_file(self, path: str, offset: int | None = None,
                  limit: int | None = None) -> ReadResult: ...
    def write_file(self, path: str, data: bytes | Iterator[bytes], mode: str | None = None,
                   exact: bool = False) -> WriteResult:
        """`exact`: a name from the repository, carried as it is (the model's are checked).
        `data` as blocks: streamed, never held whole on the host."""
        ...

    def delete_file(self, path: str, exact: bool = False) -> str: ...
    def list_files(self, path: str | None = None) -> list[str]: ...
    def run(self, command: str, timeout: float) -> CommandResult: ...


@dataclass(frozen=True)
class Preparation:
    """What a `Preparer` works for: one backend of a run (see `Environments`)."""

    repo: Repo
    settings: SandboxSettings
    policy: SetupPolicy
    report: Reporter
    source: str  # the commit whose setups alone share a package cache
    tag: str | None  # the git metadata's version tag
    fresh: bool  # --no-cache: prepare each environment again, once per run
    git_lock: threading.Lock


class Preparer(Protocol):
    """Prepared environments (`[sandbox] setup`) and the workspace's git metadata: Docker's
    alone (`docker/preparer.py`). Sandboxes open through it, from a tree's environment."""

    def key(self, tree: str) -> str | None: ...
    def prepared_id(self, tree: str) -> str | None: ...
    def image_for(self, tree: str, version: Version | None = None, prepare: bool = True
                  ) -> str | None: ...
    def open(self, label: str, image: str | None) -> AbstractContextManager[Sandbox]: ...
    def prepare_workspace(self, box: Sandbox, tree: str, version: Version,
                          with_first_command: bool = False) -> None: ...
    def wipe(self, box: Sandbox, exec_used: Callable[[], None]) -> list[str] | None: ...
    def settle(self) -> None: ...


class Backend(Protocol):
    """Where sandboxes run. `open` gives one fresh sandbox, removed when the block exits.

    This is all the loop and `verify` need: a sandbox that speaks the helper's protocol over a
    byte stream (no volume, no port), a way to remove what a killed run left (`reap`, by the
    run's labels), and what keys the cache (`environment`). A pod reached by an exec stream
    fits it as a container does (docs/scaling.md). Prepared environments and the workspace's
    git metadata are a `Preparer`'s, which only Docker has: other backends answer None and
    run without them, with a warning."""

    name: str

    def open(self, label: str) -> AbstractContextManager[Sandbox]: ...
    def reap(self) -> int: ...
    def describe(self) -> str: ...

    def engine_name(self) -> str:
        """Where the sandboxes go, as a run's header names it (the backend's name, or the
        engine's endpoint)."""
        ...

    def environment(self) -> str:
        """What, besides the tree and the commands, decides a build's result here: part of the
        verification cache's key (the image's ID for Docker; `Environments.describe()` adds
        the setup's)."""
        ...

    def preparer(self, job: Preparation) -> Preparer | None:
        """Who prepares this backend's environments, or None where there are none."""
        ...


class HelperSandbox:
    """A `Sandbox` over the helper's JSON-line protocol."""

    def __init__(self, transport: Transport, env: dict[str, str] | None = None) -> None:
        self._transport = transport
        self._env = env or {}
        self._next_id = 0

    def request(self, op: str, payload: bytes = b"", chunks: Iterable[bytes] | None = None,
                seconds: float = FILE_TOOL_S, **args: Any) -> dict[str, Any]:
        """One request and its answer, which must carry the request's id and arrive within
        `seconds` (stretched by this machine's load, `deadlines.stretched`). `chunks` stream
        after the request line as length-prefixed frames."""
        self._next_id += 1
        rid = self._next_id
        message = {"id": rid, "op": op, **args}
        if chunks is not None:
            message["chunked"] = True
        elif payload:
            message["payload"] = len(payload)
        seconds = deadlines.stretched(seconds)  # a busy machine answers slowly, not never
        self._transport.set_deadline(time.monotonic() + seconds)
        try:
            self._transport.send(json.dumps(message).encode() + b"\n" + payload)
            for chunk in chunks or ():
                if chunk:
                    self._transport.send(len(chunk).to_bytes(4, "big") + chunk)
            if chunks is not None:
                self._transport.send(b"\0\0\0\0")
            line = self._transport.readline()
        except DeadlineExceeded:
            raise DeadlineExceeded(f"the sandbox did not answer `{op}` within {seconds:.0f} s, "
                                   "so it was removed",
                                   "Something in it stopped the helper, or a file is too large "
                                   "to handle in time. Rerun to resume; if it happens again, "
                                   "check what the build leaves in the workspace.") from None
        except OSError as exc:
            raise SandboxError(f"the sandbox helper was lost: {exc}",
                               self._transport.describe_failure()) from None
        finally:
            self._transport.set_deadline(None)
        return self._answer(line, rid)

    def _answer(self, line: bytes, rid: int) -> dict[str, Any]:
        if not line:
            raise SandboxError("the sandbox helper stopped answering",
                               self._transport.describe_failure())
        try:
            response = json.loads(line)
        except ValueError:
            raise SandboxError(f"the sandbox helper sent something that is not JSON: {line[:200]!r}"
                               ) from None
        if not isinstance(response, dict) or response.get("id") != rid:
            got = response.get("id") if isinstance(response, dict) else None
            raise SandboxError(f"the sandbox helper answered request {got!r}, not {rid}",
                               "Something in the sandbox wrote to the helper's output; the "
                               "answer was not trusted.")
        if not response.get("ok"):
            raise ToolFailure(str(response.get("error", "unknown error")))
        return response

    def call(self, message: Request, answer: type[Answer], payload: bytes = b"",
             chunks: Iterable[bytes] | None = None, seconds: float = FILE_TOOL_S) -> Answer:
        """A request built from its dataclass; its answer read into `answer`, whose fields
        must match (an unknown, missing or mistyped field is a SandboxError that names it)."""
        body = self.request(message.OP, payload, chunks, seconds, **to_wire(message))
        try:
            return from_wire(answer, {k: v for k, v in body.items() if k not in ("id", "ok")})
        except ProtocolError as exc:
            raise SandboxError(f"the sandbox helper's answer to `{message.OP}` does not fit the "
                               f"protocol: {exc}", "Something in the sandbox wrote to the "
                               "helper's output, or the helper is not this version's; the "
                               "answer was not trusted.") from None

    def hello(self) -> HelloResponse:
        return self.call(HelloRequest(), HelloResponse)

    def load_tree(self, tar: TarStream, record: bool = False) -> int:
        """`record`: the helper keeps the names (a setup's snapshot leaves them out)."""
        return self.call(ExtractRequest(record), ExtractResponse, chunks=tar.chunks,
                         seconds=LOAD_S).files

    def reset(self) -> list[str]:
        """The helper's half of a wipe (see `ResetRequest`): how the sandbox still differs from
        what it was when the helper started."""
        return list(self.call(ResetRequest(), ResetResponse, seconds=LOAD_S).left)

    def read_file(self, path: str, offset: int | None = None,
                  limit: int | None = None) -> ReadResult:
        r = self.call(ReadRequest(path, offset, limit), ReadResponse)
        return ReadResult(r.text, r.binary, r.lines, r.start, r.end, bool(r.more))

    def write_file(self, path: str, data: bytes | Iterator[bytes], mode: str | None = None,
                   exact: bool = False) -> WriteResult:
        if isinstance(data, bytes):
            r = self.call(WriteRequest(path, mode, exact), WriteResponse, data)
        else:  # a blob from the repository: length-prefixed frames, as a tree streams in
            r = self.call(WriteRequest(path, mode, exact), WriteResponse, chunks=data)
        return WriteResult(r.status, r.summary, r.diff)

    def delete_file(self, path: str, exact: bool = False) -> str:
        return self.call(DeleteRequest(path, exact), DeleteResponse).summary

    def list_files(self, path: str | None = None) -> list[str]:
        return list(self.call(ListRequest(path), ListResponse).files)

    def run(self, command: str, timeout: float) -> CommandResult:
        r = self.call(RunRequest(command, timeout, self._env), RunResponse,
                      seconds=timeout + COMMAND_MARGIN_S)
        return CommandResult(command, r.exit_code, r.timed_out, r.output, r.total_bytes,
                             r.truncated, r.seconds)

    def export(self, sink: Sink, max_size: int, paths: list[str] | None = None
               ) -> Iterator[OutFile]:
        """Copy-out: the workspace's files (or those at or under `paths`), each handed to
        `sink` as its bytes stream in, then yielded with the object id the sink gave. The
        stream is checked as it is read (see copyout.py); a departure is a SandboxError.
        Consume it to the end: a stream refused or left midway leaves the helper's output out
        of step, so the sandbox is not to be used again (a file the helper could not send ends
        the stream in step, and the sandbox stays usable)."""
        answer = self.call(ExportRequest(max_size, paths), ExportResponse, seconds=LOAD_S)
        reader = ExportReader(self._transport.read, answer.files, max_size, sink)
        limit = deadlines.stretched(LOAD_S)
        self._transport.set_deadline(time.monotonic() + limit)
        try:
            yield from reader.files()
        except DeadlineExceeded:
            raise DeadlineExceeded(f"the sandbox did not finish copying out within {limit:.0f}"
                                   " s, so it was removed", "Rerun to resume; if it happens "
                                   "again, check what the build leaves in the workspace."
                                   ) from None
        except OSError as exc:
            raise SandboxError(f"the sandbox helper was lost: {exc}",
                               self._transport.describe_failure()) from None
        finally:
            self._transport.set_deadline(None)

    def close(self) -> None:
        self._transport.close()


def check_isolation(box: HelperSandbox, what: str) -> HelloResponse:
    """Say hello; refuse a sandbox whose helper reports it is not isolated."""
    info = box.hello()
    problems = info.problems
    if problems:
        raise SandboxError(f"{what} is not isolated: " + "; ".join(problems),
                           "Check the [sandbox] settings and the engine; retcon-sandbox will not "
                           "run untrusted code in it.")
    return info

