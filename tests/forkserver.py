"""The real command line, started without paying for an interpreter and its imports each time.

The tests run `python -m retcon_sandbox` hundreds of times. Each run used to spend 0.3 to 1 s of
CPU before doing anything: starting the interpreter, importing GitPython, docker, tomlkit and
(for the model's commands) openai. A server process, started once per test process, imports the
command line's modules and nothing else, runs nothing, and forks one child per command. The
child is what a fresh `python -m retcon_sandbox` would be once its imports were done:

- a process of its own (its own pid, start time, signal handlers and children);
- the caller's environment, working directory, umask and standard streams (standard input
  from /dev/null, output and error to the caller's pipes);
- the command line set by `runpy` as `-m` sets it (`sys.argv[0]` the `__main__` module's
  path, `sys.path[0]` the working directory);
- an ordinary interpreter exit: atexit handlers, thread joins, flushed streams, the exit
  code (negative for a signal, as `subprocess` reports it).

What a fork cannot give is an interpreter started under the caller's environment: variables
read at start-up (`PYTHON*`, the locale's) keep the server's values. `ForkServer.run` refuses
a command whose such variables differ from the server's (None), and the caller starts a real
interpreter for it.

Run as a script, this file is the server: `python forkserver.py` prints its socket's path on
one line and serves until its standard input closes (the test process has ended).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SKIP = ("retcon_sandbox.__main__", "retcon_sandbox.sandbox")  # the command; the containers' code
LENGTH = struct.Struct("!I")
PID = struct.Struct("!q")
CODE = struct.Struct("!i")
STREAMS = 3  # standard input, output and error, passed with the request


def read_at_start(name: str) -> bool:
    """Whether the interpreter reads this variable when it starts (so a fork of an interpreter
    started without it differs from one started with it)."""
    return name.startswith(("PYTHON", "LC_")) or name in ("LANG", "LANGUAGE")


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    args: list[str]
    cwd: str
    env: dict[str, str]
    umask: int


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, LENGTH.size, STREAMS)
    (size,) = LENGTH.unpack(head)
    payload = b""
    while len(payload) < size:
        chunk = conn.recv(size - len(payload))
        if not chunk:
            raise ConnectionError("the request ended early")
        payload += chunk
    fields = json.loads(payload)
    return Request(fields["args"], fields["cwd"], fields["env"], fields["umask"]), fds


def serve(path: str) -> Request:
    """Serve until standard input closes; return only in a child, with its request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sys.stdout.write(path + "\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its caller)
    while True:
        for key, _ in selector.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    sys.exit(0)
            elif key.data == "accept":
                conn, _addr = listener.accept()
                request, fds = _receive(conn)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    conn.close()
                    for pidfd, (_pid, other) in waiting.items():
                        os.close(pidfd)
                        other.close()
                    _become_the_command(request, fds)
                    return request
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ, "ended")
                _send(conn, PID.pack(pid))
            else:
                pid, conn = waiting.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _pid, status = os.waitpid(pid, 0)
                _send(conn, CODE.pack(os.waitstatus_to_exitcode(status)))
                conn.close()


def _send(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the caller is gone (it gave up on a command)
        conn.sendall(data)


def _become_the_command(request: Request, fds: list[int]) -> None:
    """In the child: the caller's streams, directory, environment and umask."""
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    os.umask(request.umask)
    tempfile.tempdir = None  # found again from TMPDIR and the rest, as at start-up
    sys.path[0] = os.getcwd()  # as `python -m` puts it
    sys.argv = ["-m", *request.args]


def _preload() -> None:
    """Every module of the command line (what any of its commands imports when it runs)."""
    import importlib
    import pkgutil

    import retcon_sandbox

    for module in pkgutil.walk_packages(retcon_sandbox.__path__, "retcon_sandbox."):
        if not module.name.startswith(SKIP):
            importlib.import_module(module.name)


def main() -> None:
    import runpy

    _preload()
    path = sys.argv[1]
    request = serve(path)  # returns in a child only
    del request
    runpy.run_module("retcon_sandbox", run_name="__main__", alter_sys=True)


# --- the client -------------------------------------------------------------------------------


class ForkServer:
    """One server, for the process that started it; `run` may be called from several threads."""

    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="retcon-forkserver-")
        self._path = os.path.join(self._folder, "socket")
        self._at_start = {name: value for name, value in os.environ.items()
                          if read_at_start(name)}
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), self._path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self._folder)
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline().decode().strip()
        if ready != self._path:
            raise RuntimeError(f"the fork server did not start (it said {ready!r})")

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=30)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        for name in os.listdir(self._folder):
            os.unlink(os.path.join(self._folder, name))
        os.rmdir(self._folder)

    def run(self, args: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> tuple[int, bytes, bytes] | None:
        """The command's exit code, output and error; None when it needs a fresh interpreter
        (a variable read at start-up differs from the server's)."""
        if {n: v for n, v in env.items() if read_at_start(n)} != self._at_start:
            return None
        umask = os.umask(0o022)
        os.umask(umask)
        payload = json.dumps({"args": args, "cwd": str(cwd), "env": env,
                              "umask": umask}).encode()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.connect(self._path)
                socket.send_fds(conn, [LENGTH.pack(len(payload))], [stdin, out_write, err_write])
                conn.sendall(payload)
            finally:
                for fd in (stdin, out_write, err_write):
                    os.close(fd)
            (pid,) = PID.unpack(_exactly(conn, PID.size))
            deadline = time.monotonic() + timeout
            try:
                out, err = _drain(out_read, err_read, deadline)
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                (code,) = CODE.unpack(_exactly(conn, CODE.size))
            except (TimeoutError, subprocess.TimeoutExpired):
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(args, timeout) from None
        return code, out, err


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the fork server closed the connection")
        data += chunk
    return data


def _drain(out_fd: int, err_fd: int, deadline: float) -> tuple[bytes, bytes]:
    """Both pipes read to their end (every writer gone), as `communicate` reads them."""
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired("", 0)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        finally:
            os.close(out_fd)
            os.close(err_fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd])


if __name__ == "__main__":
    main()
