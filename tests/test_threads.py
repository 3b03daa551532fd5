"""The run's threads block Ctrl-C, SIGTERM and SIGHUP, so the kernel gives those signals to
the main thread, whose waiting call they interrupt; the thread that starts one keeps its
mask."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

from retcon_sandbox import threads


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
    with ThreadPoolExecutor(max_workers=2, initializer=threads.leave_stops_to_main) as pool:
        masks = list(pool.map(lambda _: blocked_here(), range(4)))
    assert all(mask >= threads.STOPS for mask in masks)
    assert not threads.STOPS & blocked_here()

