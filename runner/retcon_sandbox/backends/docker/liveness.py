"""Whether the run that created a sandbox container is still alive, so `clean` removes only the
containers of runs that are gone.

Each container carries labels naming its run's process: the host, the pid, and the process's
start (the kernel's boot id and the start time in clock ticks since boot), so a pid reused by
another process, or a reboot, does not pass for the same run. `alive` decides from those labels
and what this host says now, without any I/O of its own.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

LABEL_HOST = "retcon-sandbox.host"
LABEL_PID = "retcon-sandbox.pid"
LABEL_STARTED = "retcon-sandbox.started"


@dataclass(frozen=True)
class Owner:
    """The process of a run: on which host, which pid, started when ("" if unknown)."""

    host: str
    pid: int
    started: str


def alive(owner: Owner | None, host: str, started_now: str | None) -> bool:
    """Whether the run `owner` still runs, seen from `host`. `started_now` is the start of the
    process that has `owner.pid` on `host` now: None when there is none, "" when its start is
    unknown. A container without owner labels (made by an older version) counts as dead; one
    from another host as alive, since this host cannot tell."""
    if owner is None:
        return False
    if owner.host != host:
        return True
    if started_now is None:
        return False
    return not (owner.started and started_now and owner.started != started_now)


def owner_of(labels: dict[str, str]) -> Owner | None:
    try:
        return Owner(labels[LABEL_HOST], int(labels[LABEL_PID]), labels.get(LABEL_STARTED, ""))
    except (KeyError, ValueError):
        return None


def labels_of(owner: Owner) -> dict[str, str]:
    return {LABEL_HOST: owner.host, LABEL_PID: str(owner.pid), LABEL_STARTED: owner.started}


def host() -> str:
    return socket.gethostname()


def this_process() -> Owner:
    return Owner(host(), os.getpid(), process_start(os.getpid()) or "")


def process_start(pid: int) -> str | None:
    """The start of the process `pid` on this host ("boot id:ticks" on Linux), "" when it exists
    but its start cannot be read, None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # Linux, and no such process
        return _exists_elsewhere(pid)
    except OSError:
        return _exists_elsewhere(pid)
    fields = stat.rsplit(")", 1)[-1].split()  # from field 3, the state
    if fields[:1] in (["Z"], ["X"]):  # a zombie: dead, only not yet waited for
        return None
    return f"{boot}:{fields[19]}" if len(fields) > 19 else ""  # field 22: starttime


def _exists_elsewhere(pid: int) -> str | None:
    """Without /proc: whether the pid exists at all."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return ""
    return ""
