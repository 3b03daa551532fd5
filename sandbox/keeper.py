"""The first process of every container retcon-sandbox starts (under the engine's init), in place
of `sleep infinity`, so that no container outlives its run. Standard library only; Python 3.8+.

Started as `python3 -I -S -c <this file> LEASE LIFETIME [COMMAND...]`. Its standard input is the
run's: the host attaches to it before the container starts, and writes a byte every few seconds
while the run lives (backends/docker/leases.py). This process exits, the engine's init with it,
and the engine removes the container (auto-remove) when:

- that input ends: the run's process is gone, even killed with -9 (the kernel closes its
  connection to the engine, which then closes this input);
- nothing came on it for LEASE seconds: a host that hangs, or a connection that died unseen;
- LIFETIME seconds have passed (0: no such bound): the run's own deadline for this container.

COMMAND, when given (the egress proxy), runs as this process's child, with no standard input,
and is killed when this process ends. Its own end is a line on stderr (`retcon-keeper: the
command ended`), and the container stays until the run is done with it: the run reads its log.
Why the container ends is one line on stderr too.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

POLL_S = 1.0  # how often a COMMAND's end is looked for


def spawn(command: list[str]) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.execv(command[0], command)
        finally:
            os._exit(127)
    return pid


def ended(child: int) -> bool:
    """Whether the child has ended (and is reaped); its end is written on stderr."""
    try:
        pid, status = os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        return True
    if pid == 0:
        return False
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    say(f"the command ended (exit {code})")
    return True


def say(line: str) -> None:
    sys.stderr.write(f"retcon-keeper: {line}\n")
    sys.stderr.flush()


def watch(lease: float, lifetime: float, child: int) -> str:
    """Wait on standard input until one of the module's reasons holds: which one."""
    start = last = time.monotonic()
    while True:
        now = time.monotonic()
        if lifetime and now >= start + lifetime:
            return f"its lifetime of {lifetime:.0f} s is over"
        if now >= last + lease:
            return f"no word from its run for {lease:.0f} s"
        if child and ended(child):
            child = 0
        waits = [last + lease - now, POLL_S if child else lease]
        if lifetime:
            waits.append(start + lifetime - now)
        ready, _, _ = select.select([0], [], [], max(min(waits), 0.01))
        if not ready:
            continue
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            return "its run is gone"
        last = time.monotonic()


def main(argv: list[str]) -> int:
    lease, lifetime = float(argv[0]), float(argv[1])
    child = spawn(argv[2:]) if len(argv) > 2 else 0
    say(f"the container ends: {watch(lease, lifetime, child)}")
    if child and not ended(child):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
