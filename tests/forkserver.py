"""The real command line, started without paying for an interpreter and its imports each time.

The tests run `python -m retcon_sandbox` hundreds of times. Each run used to spend 0.2 to 1 s of
CPU before doing anything: starting the interpreter, importing GitPython, docker, tomlkit and
(for the model's commands) openai. A server process, started once per test process, imports the
command line's modules and libraries, runs nothing, and forks one child per command. The child
is what a fresh `python -m retcon_sandbox` would be once its imports were done:

- a process of its own (its own pid, start time, signal handlers and children);
- the caller's environment, working directory, umask and standard streams (standard input
  from /dev/null, output and error to the caller's pipes), and the time zone of its `TZ`;
- the command line set by `runpy` as `-m` sets it (`sys.argv[0]` the `__main__` module's
  path, `sys.path[0]` the working directory);
- what the command line computes once per process at import (the run's id) computed again;
- an ordinary interpreter exit: atexit handlers, thread joins, flushed streams, the exit
  code (negative for a signal, as `subprocess` reports it). Not the teardown of every module
  after them: it walks every object the imports made, copying each page the fork shares
  (0.08 s of CPU per command, two thirds of what one spent); a command's own objects left in
  reference cycles are still collected.

The server freezes what its imports made (`gc.freeze`) before it forks: a child's collections,
and its interpreter's exit, would otherwise walk every object of docker, openai and the rest,
touching each page the fork shares (0.3 s of CPU per command, more than a fresh interpreter's
`--version`; 0.06 s frozen).

What a fork cannot give is an interpreter started under the caller's environment: variables
read at start-up or at import (`PYTHON*`, the locale's, GitPython's, openai's log level) keep
the server's values. `ForkServer.run` declines a command whose such variables differ from the
server's (None), and the caller starts a real interpreter for it; it declines too when the
server cannot be reached.

The projects' own tests are served the same way. The local backend runs each commit's
`python3 -m pytest` through the tests' `python3` (conftest.write_interpreter): a server that
has imported pytest forks it, as this one forks the command line (importing pytest was two
thirds of each of those runs' CPU, and whole runs make hundreds). There the caller is a
process the backend started, not the test process: tests/forkclient.py.

Run as a script, this file is the server: `python forkserver.py SOCKET [MODULE]` (MODULE:
`retcon_sandbox`, the default, or `pytest`) prints SOCKET on one line
once it listens, and serves until its standard input closes (the test process has ended). A
caller ends a command early by writing one byte on its connection (the server kills the child
through its pidfd, never a pid that may have been reused); a caller that goes away ends its
command too. The server removes its folder (the socket and its log) as it ends, so a test
process that was killed leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

try:
    from tests import forkclient as wire
except ModuleNotFoundError:  # run as the server's script: this file's folder is on sys.path
    import forkclient as wire  # type: ignore[import-not-found,no-redef]

SKIP = ("retcon_sandbox.__main__", "retcon_sandbox.sandbox")  # the command; the containers' code
LIBRARIES = ("docker", "git", "openai", "tomlkit", "tenacity")  # imported where they are used
LOG = "server.log"  # beside the socket: the server's standard error
PRELOAD = {"retcon_sandbox": ("retcon_sandbox",), "pytest": ("pytest", "_pytest")}


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    args: list[str]
    cwd: str
    env: dict[str, str]
    umask: int


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, wire.LENGTH.size, wire.STREAMS)
    try:
        if len(head) != wire.LENGTH.size or len(fds) != wire.STREAMS:
            raise ValueError("a request without its length or its three streams")
        fields = json.loads(wire.exactly(conn, wire.LENGTH.unpack(head)[0]))
        return Request(list(fields["args"]), str(fields["cwd"]), dict(fields["env"]),
                       int(fields["umask"])), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def serve(path: str) -> Request:
    """Serve until standard input closes; return only in a child, with its request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sys.stdout.write(path + "\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, ("accept", None))
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, ("parent", None))
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its caller)
    while True:
        for key, _ in selector.select():
            kind, pidfd = key.data
            if kind == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    _remove_folder(path)  # the test process is gone, even if it was killed
                    sys.exit(0)
            elif kind == "accept":
                conn, _addr = listener.accept()
                conn.settimeout(wire.CONNECT_S)  # a caller sending nothing holds no one up long
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    print(f"forkserver: a request refused: {exc!r}", file=sys.stderr)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    conn.close()
                    for other_pidfd, (_pid, other) in waiting.items():
                        os.close(other_pidfd)
                        other.close()
                    _become_the_command(request, fds)
                    return request
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ, ("ended", pidfd))
                _send(conn, wire.PID.pack(pid))
                selector.register(conn, selectors.EVENT_READ, ("caller", pidfd))
            elif kind == "caller":  # a byte: end the command; nothing: the caller is gone
                with contextlib.suppress(OSError):
                    key.fileobj.recv(1)  # type: ignore[union-attr]
                selector.unregister(key.fileobj)
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                pid, conn = waiting.pop(pidfd)
                selector.unregister(pidfd)
                with contextlib.suppress(KeyError):
                    selector.unregister(conn)
                _pid, status = os.waitpid(pid, 0)
                os.close(pidfd)
                _send(conn, wire.CODE.pack(os.waitstatus_to_exitcode(status)))
                conn.close()


def _remove_folder(path: str) -> None:
    """The server's folder: its socket, its log and the folder itself (nothing else is in it)."""
    folder = os.path.dirname(path)
    for name in (path, os.path.join(folder, LOG), os.path.join(folder, wire.AT_START)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(folder)


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
    time.tzset()
    tempfile.tempdir = None  # found again from TMPDIR and the rest, as at start-up
    if "retcon_sandbox.report" in sys.modules:  # the command line's server
        report = sys.modules["retcon_sandbox.report"]
        report.RUN_ID = report.new_run_id()  # type: ignore[attr-defined]  # one per process
    sys.path.insert(0, os.getcwd())  # as `python -m` puts it
    sys.argv = ["-m", *request.args]


def _preload(command: str) -> None:
    """Every module of the command's packages; for the command line, the libraries its
    commands import when they run too."""
    import importlib
    import pkgutil

    for name in PRELOAD[command]:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(getattr(package, "__path__", []), f"{name}."):
            if not module.name.startswith(SKIP) and not module.name.endswith(".__main__"):
                importlib.import_module(module.name)
    if command == "retcon_sandbox":
        for library in LIBRARIES:
            importlib.import_module(library)


def main() -> None:
    import runpy

    del sys.path[0]  # this file's folder (tests/, whose `docker` package is not the SDK)
    command = sys.argv[2] if len(sys.argv) > 2 else "retcon_sandbox"
    _preload(command)
    gc.collect()
    gc.freeze()  # what the imports made is never collected: no child's collection walks it
    at_start = {name: value for name, value in os.environ.items() if wire.read_at_start(name)}
    Path(os.path.dirname(sys.argv[1]), wire.AT_START).write_text(
        json.dumps({"command": command, "at_start": at_start}))
    request = serve(sys.argv[1])  # returns in a child only
    del request
    try:
        runpy.run_module(command, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _exit_code(exc: SystemExit) -> int:
    """The exit code of an uncaught SystemExit, as the interpreter reads it (a message is
    printed on standard error, with code 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """What the interpreter's exit does that anyone can see, without the rest: it waits for
    the threads that are not daemons, runs the atexit handlers, collects what the command left
    in reference cycles and flushes the standard streams (a failed flush of standard output is
    reported and makes the code 120), then ends the process.

    Left out is the teardown of every module and the last collection, which walk every object
    the imports made: in a forked child each page they touch is copied first, 0.08 s of CPU
    per command (two thirds of one), and hundreds of commands each run."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    gc.collect()  # only what the command made: the imports' objects are frozen
    try:
        if sys.stdout is not None and not sys.stdout.closed:
            sys.stdout.flush()
    except Exception as exc:  # as the interpreter reports it: "Exception ignored in: <stdout>"
        sys.unraisablehook(types.SimpleNamespace(
            exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__, err_msg=None,
            object=sys.stdout))
        code = 120
    with contextlib.suppress(Exception):
        if sys.stderr is not None:
            sys.stderr.flush()
    if code < 0:  # ended by a signal, as an interrupted interpreter ends
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


# --- the client -------------------------------------------------------------------------------


class ForkServer:
    """One server, for the process that started it; `run` may be called from several threads.
    `env`: the server's environment (the test process's own, before any test changed it)."""

    def __init__(self, env: dict[str, str], command: str = "retcon_sandbox") -> None:
        folder = tempfile.mkdtemp(prefix="retcon-forkserver-")
        self._path = os.path.join(folder, "socket")
        self._log = os.path.join(folder, LOG)
        self._at_start = {name: value for name, value in env.items() if wire.read_at_start(name)}
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), self._path, command],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=folder,
                env=env)
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline().decode().strip()
        if ready != self._path:
            self.close()
            raise RuntimeError(f"the fork server did not start: {self.said()}")

    @property
    def path(self) -> str:
        """The server's socket, for `--client`."""
        return self._path

    def said(self) -> str:
        """What the server wrote on its standard error."""
        try:
            return Path(self._log).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        _remove_folder(self._path)  # the server removed it as it ended, unless it was killed

    def run(self, args: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> tuple[int, bytes, bytes] | None:
        """The command's exit code, output and error; None when it needs a fresh interpreter
        (a variable read at start-up differs from the server's) or the server does not
        answer. `subprocess.TimeoutExpired` (with what was read) past `timeout`."""
        if {n: v for n, v in env.items() if wire.read_at_start(n)} != self._at_start:
            return None
        payload = json.dumps({"args": args, "cwd": str(cwd), "env": env,
                              "umask": wire.umask_of_this_process()}).encode()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.settimeout(wire.CONNECT_S)
                conn.connect(self._path)
                socket.send_fds(conn, [wire.LENGTH.pack(len(payload))],
                                [stdin, out_write, err_write])
                conn.sendall(payload)
                wire.exactly(conn, wire.PID.size)  # the child's pid: it has started
            except OSError:
                os.close(out_read)
                os.close(err_read)
                return None  # not started: the caller starts a fresh interpreter
            finally:
                for fd in (stdin, out_write, err_write):
                    os.close(fd)
            deadline = time.monotonic() + timeout
            out, err, finished = _drain(out_read, err_read, deadline)
            try:
                if not finished:
                    raise TimeoutError
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                (code,) = wire.CODE.unpack(wire.exactly(conn, wire.CODE.size))
            except TimeoutError:
                _send(conn, b"k")  # the server kills it through its pidfd
                raise subprocess.TimeoutExpired(["retcon_sandbox", *args], timeout, out,
                                                err) from None
        return code, out, err


def _drain(out_fd: int, err_fd: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """Both pipes read to their end (every writer gone), as `communicate` reads them, or until
    `deadline`: what was read, and whether both ended."""
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
            finished = not selector.get_map()
        finally:
            os.close(out_fd)
            os.close(err_fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), finished


if __name__ == "__main__":
    main()
