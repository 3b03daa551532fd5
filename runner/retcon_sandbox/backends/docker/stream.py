"""The exec stream: a `docker exec` attach socket, read and written within deadlines.

ExecStream demultiplexes the engine's frames; ExecTransport carries the helper's protocol (its
stdin and stdout) over one such stream.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

from retcon_sandbox.backends.api import LINE_CAP, DeadlineExceeded
from retcon_sandbox.backends.docker.engine import DockerEngine, EngineError
from retcon_sandbox.errors import SandboxError

STDERR_CAP = 64 * 1024
FRAME_CAP = 64 * 1024 * 1024


class ExecStream:
    """A `docker exec` attach socket, demultiplexed (frames of stream 1 = stdout, 2 = stderr)
    in linear time, every wait bounded by the deadline in force."""

    def __init__(self, sock: Any) -> None:
        self._owner = sock  # kept: when collected (by the cycle collector, at any time), the
        # wrapper the engine's client returned closes the socket under us (EBADF)
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.deadline: float | None = None
        self._buf = bytearray()
        self._pos = 0

    def frame(self) -> tuple[int, bytes] | None:
        """The next frame, or None at end of stream."""
        header = self._take(8)
        if header is None:
            return None
        size = int.from_bytes(header[4:8], "big")
        if size > FRAME_CAP:
            raise SandboxError(f"the sandbox sent a frame of {size} bytes (at most {FRAME_CAP})")
        payload = self._take(size)
        return None if payload is None else (header[0], payload)

    def send(self, data: bytes) -> None:
        self._wait_budget()
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise DeadlineExceeded("the sandbox stopped reading its input") from None

    def _take(self, n: int) -> bytes | None:
        while len(self._buf) - self._pos < n:
            if not self._recv():
                return None
        data = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        if self._pos > (1 << 20) and 2 * self._pos > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        return data

    def _recv(self) -> bool:
        self._wait_budget()
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            raise DeadlineExceeded("the sandbox did not answer in time") from None
        if not chunk:
            return False
        self._buf += chunk
        return True

    def _wait_budget(self) -> None:
        if self.deadline is None:
            self.sock.settimeout(None)
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the sandbox did not answer in time")
        self.sock.settimeout(left)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            self.sock.close()


class ExecTransport:
    """The helper's stdin/stdout over its `docker exec`: lines found in linear time, none
    longer than LINE_CAP, stderr kept (capped) for error messages."""

    def __init__(self, engine: DockerEngine, exec_id: str, sock: Any) -> None:
        self._engine = engine
        self._exec_id = exec_id
        self._stream = ExecStream(sock)
        self._out = bytearray()
        self._scanned = 0
        self._err = bytearray()

    def set_deadline(self, deadline: float | None) -> None:
        self._stream.deadline = deadline

    def send(self, data: bytes) -> None:
        self._stream.send(data)

    def readline(self) -> bytes:
        while True:
            end = self._out.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._out[: end + 1])
                del self._out[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._out)
            if len(self._out) > LINE_CAP:
                raise SandboxError(f"the sandbox helper sent a line over {LINE_CAP} bytes")
            frame = self._stream.frame()
            if frame is None:
                line = bytes(self._out)
                self._out.clear()
                return line
            stream, payload = frame
            if stream == 1:
                self._out += payload
            elif len(self._err) < STDERR_CAP:
                self._err += payload[: STDERR_CAP - len(self._err)]

    def read(self, n: int) -> bytes:
        """Exactly `n` bytes of the helper's stdout (fewer at end of stream)."""
        while len(self._out) < n:
            frame = self._stream.frame()
            if frame is None:
                break
            stream, payload = frame
            if stream == 1:
                self._out += payload
            elif len(self._err) < STDERR_CAP:
                self._err += payload[: STDERR_CAP - len(self._err)]
        data = bytes(self._out[:n])
        del self._out[:n]
        self._scanned = 0
        return data

    def close(self) -> None:
        self._stream.close()

    def exit_code(self) -> int | None:
        return self._engine.exec_exit_code(self._exec_id)

    def describe_failure(self) -> str:
        err = (self._err + self._out[-2000:]).decode(errors="replace").strip()[-2000:]
        try:
            code: object = self.exit_code()
        except EngineError as exc:
            code = f"unknown (the engine did not say: {exc.message})"
        return f"helper exit code {code}; it said: {err or '(nothing)'}"
