"""The run's threads block Ctrl-C, SIGTERM and SIGHUP, so the kernel gives those signals to
the main thread, whose waiting call they interrupt; the thread that starts one keeps its
mask."""

from __future__ import annotations

import signal
import threading

from retcon_sandbox import threads
from retcon_sandbox.backends.local import LocalBackend


def blocked_here() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_started_thread_blocks_the_stop_signals_and_its_starter_does_not() -> None:
    before = blocked_here()
    seen: list[set[int]] = []
    thread = threads.start(lambda: seen.append(blocked_here()), "test-thread")
    thread.join(10)
    assert thread.daemon and thread.name == "test-thread"
    assert seen and seen[0] >= threads.STOPS
    assert blocked_here() == before
    assert not threads.STOPS & before


def test_a_pool_s_threads_block_them_too() -> None:
    with threads.pool(2, "test-pool") as pool:
        masks = list(pool.map(lambda _: blocked_here(), range(4)))
    assert all(mask >= threads.STOPS for mask in masks)
    assert not threads.STOPS & blocked_here()



def test_a_command_run_from_such_a_thread_has_no_signal_blocked() -> None:
    """The local helper, started from a thread that blocks the stop signals, clears its mask,
    so what it starts gets every signal, whatever the shell (dash clears the mask, bash keeps
    it): the helper's own mask (the shell's parent) and the command's are empty."""
    found: list[str] = []

    def run() -> None:
        with LocalBackend().open("test") as sandbox:
            found.append(sandbox.run("grep SigBlk /proc/$PPID/status /proc/self/status", 60)
                         .output)

    threads.start(run, "test-local").join(60)
    assert found, "the command did not run"
    masks = [line.split()[-1] for line in found[0].splitlines()]
    assert masks == ["0000000000000000", "0000000000000000"], found[0]


def test_threads_a_library_starts_in_quiet_block_the_stop_signals_too() -> None:
    seen: list[set[int]] = []
    with threads.quiet():
        thread = threading.Thread(target=lambda: seen.append(blocked_here()))
        thread.start()
    thread.join(10)
    assert seen and seen[0] >= threads.STOPS
    assert not threads.STOPS & blocked_here()
