"""The client of a fork server (tests/forkserver.py) for a caller that is not the test process:
the tests' `python3 -m pytest` (conftest.write_interpreter), which the local backend runs as a
project's test command, and the wire protocol both sides speak.

    python -I -S forkclient.py SOCKET PYTHON -m MODULE ARGS...

hands the server at SOCKET this process's standard streams, directory, environment and umask,
waits, and ends as the command ended: its exit code, or the signal that ended it. If this
process is killed or interrupted, the server kills the command (its connection closed). It
runs `PYTHON -m MODULE ARGS...` itself instead when the server serves another module, when a
variable read at start-up differs from the server's (written beside its socket), or when the
server does not answer. Standard library only, and only what the client needs: it runs once
per command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

LENGTH = struct.Struct("!I")
PID = struct.Struct("!q")
CODE = struct.Struct("!i")
STREAMS = 3  # standard input, output and error, passed with the request
CONNECT_S = 30.0
AT_START = "at-start.json"  # beside the socket: what the server serves, its start-up variables


def read_at_start(name: str) -> bool:
    """Whether the interpreter or a library reads this variable once, when it starts or is
    imported (so a fork of a server started without it differs from a fresh start with it)."""
    return (name.startswith(("PYTHON", "LC_", "GIT_PYTHON_"))
            or name in ("LANG", "LANGUAGE", "OPENAI_LOG"))


def client(path: str, interpreter: str, args: list[str]) -> None:
    """Run `interpreter args...` forked by the server at `path`, as this process: its streams,
    directory, environment and umask; end as the command ended. The interpreter itself when
    the server cannot run it as a fresh start would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it quietly, and so the command
    env = dict(os.environ)
    try:
        with open(os.path.join(os.path.dirname(path), AT_START), encoding="utf-8") as file:
            served = json.load(file)
    except (OSError, ValueError):
        served = {}
    if (args[:2] != ["-m", served.get("command")] or served.get("at_start") !=
            {name: value for name, value in env.items() if read_at_start(name)}):
        os.execv(interpreter, [interpreter, *args])
    payload = json.dumps({"args": args[2:], "cwd": os.getcwd(), "env": env,
                          "umask": umask_of_this_process()}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_S)
        conn.connect(path)
        socket.send_fds(conn, [LENGTH.pack(len(payload))], [0, 1, 2])
        conn.sendall(payload)
        exactly(conn, PID.size)  # the child's pid: it has started
    except OSError:
        conn.close()
        os.execv(interpreter, [interpreter, *args])
    conn.settimeout(None)
    try:
        (code,) = CODE.unpack(exactly(conn, CODE.size))
    except OSError as exc:
        os.write(2, f"forkserver: the server went away: {exc}\n".encode())
        code = 1
    if code < 0:  # ended by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def umask_of_this_process() -> int:
    """This process's umask, read without setting it (another thread may be reading it too)."""
    with open("/proc/self/status", encoding="utf-8") as status:
        lines = status.read().splitlines()
    for line in lines:
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise RuntimeError("no Umask in /proc/self/status")


def exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection ended early")
        data += chunk
    return data


if __name__ == "__main__":
    client(sys.argv[1], sys.argv[2], sys.argv[3:])
