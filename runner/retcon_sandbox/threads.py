"""Threads that leave Ctrl-C, SIGTERM and SIGHUP to the main thread.

The kernel gives a signal sent to the process to any of its threads that does not block it.
Python runs signal handlers in the main thread only, between two bytecodes: when another thread
takes Ctrl-C while the main thread waits in a system call (a model's answer that does not come,
a socket read), the main thread is not interrupted, and the run goes on until that call returns,
minutes later or never. Every thread the run starts blocks these signals, so they reach the
main thread, whose waiting call is interrupted at once. So do the threads a library starts
inside `quiet()` (paramiko's transport, for an ssh:// engine).

A process started from such a thread inherits the mask. The sandbox's helper clears it when it
starts, so the commands it runs (a project's `timeout`, `kill` or `terminate()`) get every
signal; the run's other children (git) end with their work or when the run closes them.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

STOPS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def leave_stops_to_main() -> None:
    """Block the stop signals in the calling thread (`pool`'s threads' first step)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread that blocks the stop signals, then runs `target`. It blocks them itself,
    as its first step: blocking them here around the start would, on restoring the mask, raise
    a Ctrl-C that came meanwhile after the thread started and before its caller kept it."""

    def run() -> None:
        leave_stops_to_main()
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def import_ahead(module: str) -> None:
    """Import `module` in a thread of `start`'s while the caller goes on (a slow SDK, whose
    first use is after the command's own checks, which mostly wait for git). A failed import
    is left for the first use to raise."""
    def load() -> None:
        with contextlib.suppress(Exception):
            importlib.import_module(module)

    start(load, f"retcon-import-{module.rsplit('.', 1)[-1]}")


def later(target: Callable[[], T], name: str) -> Callable[[], T]:
    """`target()`, begun now in a thread of `start`'s; the callable returned waits for it, then
    gives what it returned or raises what it raised (each time it is called)."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(target())
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    thread = start(run, name)

    def result() -> T:
        thread.join()
        if failed:
            raise failed[0]
        return done[0]

    return result


def pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads block the stop signals."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name,
                              initializer=leave_stops_to_main)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The stop signals blocked in this thread for the block, so that the threads a library
    starts in it inherit the block; one that came meanwhile is raised at the end."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
