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


def test_later_gives_its_result_or_raises_its_error_in_the_caller() -> None:
    """Work begun ahead (the model's check): its answer, or its error, where it is taken, from
    a thread that blocked the stop signals; asked again, the same."""
    gate = threading.Event()

    def answer() -> set[int]:
        gate.wait(10)
        return blocked_here()

    result = threads.later(answer, "test-later")
    gate.set()
    assert result() >= threads.STOPS and result() >= threads.STOPS

    def fail() -> int:
        raise ValueError("refused")

    failing = threads.later(fail, "test-later")
    for _ in range(2):
        try:
            failing()
        except ValueError as exc:
            assert str(exc) == "refused"
        else:
            raise AssertionError("no error raised")


def test_held_events_follow_the_run_s_own_and_then_pass_through() -> None:
    from retcon_sandbox.reconstruct.context import Buffered, Held

    run = Buffered("r")
    held = Held(run)
    held.emit("phase_start", phase="model")
    run.emit("spec")
    held.emit("phase_end", phase="model")
    assert [e for e, _ in run.events] == ["spec"]
    held.release()
    held.emit("model_retry", message="again")
    assert run.events == [("spec", {}), ("phase_start", {"phase": "model"}),
                          ("phase_end", {"phase": "model"}), ("model_retry", {"message": "again"})]
    assert held.run_id == "r"
