"""The sandbox interface: how commands and file tools run, whatever runs the sandbox.

`Sandbox` is what the loop uses. `HelperSandbox` implements it by speaking the helper's JSON-line
protocol over a `Transport`; the backends (a Docker container, or a local directory for tests)
differ only in how they start the helper and move bytes to and from it.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from retcon_sandbox.archive import TarStream
from retcon_sandbox.errors import SandboxError


class ToolFailure(Exception):
    """A file tool or command was refused or failed in a way the model can act on."""


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


@dataclass(frozen=True)
class WriteResult:
    status: str  # created | updated | unchanged | binary
    summary: str
    diff: str | None


class Transport(Protocol):
    def send(self, data: bytes) -> None: ...
    def readline(self) -> bytes: ...
    def close(self) -> None: ...
    def describe_failure(self) -> str: ...


class Sandbox(Protocol):
    def load_tree(self, tar: TarStream) -> int: ...
    def read_file(self, path: str, offset: int | None = None,
                  limit: int | None = None) -> ReadResult: ...
    def write_file(self, path: str, data: bytes, mode: str | None = None) -> WriteResult: ...
    def delete_file(self, path: str) -> str: ...
    def list_files(self, path: str | None = None) -> list[str]: ...
    def run(self, command: str, timeout: float) -> CommandResult: ...


class Backend(Protocol):
    """Where sandboxes run. `open` gives one fresh sandbox, removed when the block exits."""

    name: str

    def open(self, label: str) -> AbstractContextManager[Sandbox]: ...
    def reap(self) -> int: ...
    def describe(self) -> str: ...

    def environment(self) -> str:
        """What, besides the tree and the commands, decides a build's result here: part of the
        verification cache's key (the image's ID for Docker; issue 10 adds the setup key)."""
        ...


class HelperSandbox:
    """A `Sandbox` over the helper's JSON-line protocol."""

    def __init__(self, transport: Transport, env: dict[str, str] | None = None) -> None:
        self._transport = transport
        self._env = env or {}
        self._next_id = 0

    def request(self, op: str, payload: bytes = b"", **args: Any) -> dict[str, Any]:
        self._next_id += 1
        message = {"id": self._next_id, "op": op, **args}
        if payload:
            message["payload"] = len(payload)
        try:
            self._transport.send(json.dumps(message).encode() + b"\n" + payload)
            line = self._transport.readline()
        except OSError as exc:
            raise SandboxError(f"lost the sandbox helper: {exc}",
                               self._transport.describe_failure()) from None
        if not line:
            raise SandboxError("the sandbox helper stopped answering",
                               self._transport.describe_failure())
        try:
            response: dict[str, Any] = json.loads(line)
        except ValueError:
            raise SandboxError(f"the sandbox helper sent something that is not JSON: {line[:200]!r}"
                               ) from None
        if not response.get("ok"):
            raise ToolFailure(str(response.get("error", "unknown error")))
        return response

    def hello(self) -> dict[str, Any]:
        return self.request("hello")

    def load_tree(self, tar: TarStream) -> int:
        return int(self.request("extract", b"".join(tar.chunks))["files"])

    def read_file(self, path: str, offset: int | None = None,
                  limit: int | None = None) -> ReadResult:
        r = self.request("read", path=path, offset=offset, limit=limit)
        return ReadResult(str(r["text"]), bool(r["binary"]), r.get("lines"))

    def write_file(self, path: str, data: bytes, mode: str | None = None) -> WriteResult:
        r = self.request("write", data, path=path, mode=mode)
        return WriteResult(str(r["status"]), str(r["summary"]), r.get("diff"))

    def delete_file(self, path: str) -> str:
        return str(self.request("delete", path=path)["summary"])

    def list_files(self, path: str | None = None) -> list[str]:
        return [str(f) for f in self.request("list", path=path)["files"]]

    def run(self, command: str, timeout: float) -> CommandResult:
        r = self.request("run", cmd=command, timeout=timeout, env=self._env)
        return CommandResult(command, int(r["exit_code"]), bool(r["timed_out"]), str(r["output"]),
                             int(r["total_bytes"]), bool(r["truncated"]), float(r["seconds"]))

    def close(self) -> None:
        self._transport.close()


def check_isolation(box: HelperSandbox, what: str) -> dict[str, Any]:
    """Say hello; refuse a sandbox whose helper reports it is not isolated."""
    info = box.hello()
    problems = info.get("problems") or []
    if problems:
        raise SandboxError(f"{what} is not isolated: " + "; ".join(problems),
                           "Check the [sandbox] settings and the engine; retcon-sandbox will not "
                           "run untrusted code in it.")
    return info

