"""Threads that leave Ctrl-C, SIGTERM and SIGHUP to the main thread.

The kernel gives a signal sent to the process to any of its threads that does not block it.
Python runs signal handlers in the main thread only, between two bytecodes: when another thread
takes Ctrl-C while the main thread waits in a system call (a model's answer that does not come,
a socket read), the main thread is not interrupted, and the run goes on until that call returns,
minutes later or never. Every thread the run starts blocks these signals, so they reach the
main thread, whose waiting call is interrupted at once.

A process started from such a thread inherits the mask. The sandbox's supervisor gives every
command it starts an empty one (`supervisor.spawn`), and the run's other children (git, the
local helper) end with their work or when the run closes them, as before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

STOPS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def leave_stops_to_main() -> None:
    """Block the stop signals in the calling thread (a pool's `initializer`)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread running `target`, started with the stop signals blocked from its first
    instruction (a thread inherits the mask of the thread that starts it)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return thread
