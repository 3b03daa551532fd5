"""Deadlines that hold on a busy machine. A wait for something that needs only CPU (a process
starting in a container, a listener opening) is stretched by how busy this machine is: its
load over the last minute per core, at least 1, at most MOST times. At load 30 on 2 cores, a
20 s start has 5 minutes: a slow start is not taken for a broken one.
"""

from __future__ import annotations

import os

MOST = 15.0


def load_per_core() -> float:
    """The 1-minute load average per core (0 where the system does not say)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0
    return load / (os.cpu_count() or 1)


def stretched(seconds: float) -> float:
    return seconds * min(max(1.0, load_per_core()), MOST)


def busy_note() -> str:
    """This machine's load, for a message about a wait that ran out."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return "this machine's load is unknown"
    return f"this machine's load is {load:.1f} on {os.cpu_count() or 1} core(s)"
