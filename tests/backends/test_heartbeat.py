"""A long image build is never silent: the heartbeat says how long it has taken."""

from __future__ import annotations

import threading

from retcon_sandbox.backends.docker.sandboximages import heartbeat


def test_a_silent_stretch_gets_a_line_with_the_elapsed_time() -> None:
    lines: list[str] = []
    beaten = threading.Event()

    def progress(line: str) -> None:
        lines.append(line)
        if "elapsed" in line:
            beaten.set()

    with heartbeat(progress, "building x", every=0.05) as say:
        say("Step 1/2")
        assert beaten.wait(30)
        with heartbeat(say, "building the parent", every=0.05) as inner:
            inner("Step 2/2")
    assert lines[0] == "Step 1/2"
    assert any(line.startswith("  ... building x: ") and line.endswith(" s elapsed")
               for line in lines)
    assert "Step 2/2" in lines and not any("parent" in line for line in lines)
