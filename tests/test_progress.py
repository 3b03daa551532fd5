"""No silent minutes: each long step (setup, sandbox, model, build, tests) is a phase, with its
start and end in the event stream, and a heartbeat line while it runs; a streaming model's
tokens are counted as they come (tests/model/test_streaming.py). Intervals are short here;
nothing asserts a duration."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from retcon_sandbox import progress
from retcon_sandbox.report import CLEAR_LINE, HumanReporter, set_verbosity


class Collector:
    """A reporter that keeps its events; `seen` is set by the first event `wanted` accepts."""

    def __init__(self, wanted: Any = None) -> None:
        self.run_id = "test"
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.seen = threading.Event()
        self._wanted = wanted or (lambda event, data: False)
        self._lock = threading.Lock()

    def emit(self, event: str, **data: Any) -> None:
        with self._lock:
            self.events.append((event, data))
        if self._wanted(event, data):
            self.seen.set()

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [data for event, data in self.events if event == name]


@pytest.fixture
def quiet_after() -> Iterator[None]:
    yield
    set_verbosity(0)


def test_a_phase_reports_its_start_and_its_end_with_seconds() -> None:
    report = Collector()
    with progress.phase(report, "tests", 3) as activity:
        assert progress.current() is activity and activity.what == "#3 tests"
        assert activity in progress.running()
    assert progress.current() is None and activity not in progress.running()
    (start, _), (end, data) = report.events
    assert (start, end) == ("phase_start", "phase_end")
    assert data["phase"] == "tests" and data["number"] == 3 and data["seconds"] >= 0
    assert "tokens" not in data


def test_each_threads_innermost_step_is_the_one_shown() -> None:
    outer = progress.Activity("setup", None, "setup", started=1.0, thread=1)
    inner = progress.Activity("setup", None, "setup `pip install`", started=2.0, thread=1)
    other = progress.Activity("tests", 2, "#2 tests", started=0.5, thread=2)
    assert progress.shown([outer, other, inner]) == [other, inner]


def test_a_step_is_owed_a_line_once_per_interval_of_silence() -> None:
    step = progress.Activity("build", 1, "#1 build", started=100.0)
    assert progress.due([step], 114.0, 15) == []
    assert progress.due([step], 115.0, 15) == [step]  # 15 s since it began
    assert progress.due([step], 129.0, 15) == []  # 14 s since that line
    step.touch()  # its own output spoke for it
    assert progress.due([step], 130.0, 15) == []
    step.tokens = 1234
    assert progress.line(step.fields(145.5)) == \
        "  ... #1 build: 46 s elapsed, 1,234 tokens streamed"


def test_the_heartbeat_speaks_for_a_long_step_and_not_for_a_short_one() -> None:
    report = Collector(lambda event, data: event == "heartbeat")
    with progress.heartbeat(report, every=0.5):
        with progress.phase(None, "sandbox", 1):
            pass  # far shorter than the interval
        with progress.phase(None, "tests", 2):
            assert report.seen.wait(30)
    beats = report.named("heartbeat")
    assert beats and all(b["what"] == "#2 tests" and b["number"] == 2 for b in beats)
    assert not any(b.get("live") for b in beats)


def test_a_live_line_is_redrawn_in_place_and_cleared_before_other_output() -> None:
    out = io.StringIO()
    report = HumanReporter(out)
    report.emit("heartbeat", live=True, what="", seconds=0)  # nothing shown: nothing erased
    assert out.getvalue() == ""
    report.emit("heartbeat", live=True, what="#1 model (turn 2)", seconds=3.2, tokens=40)
    report.emit("heartbeat", live=True, what="#1 model (turn 2)", seconds=4.2, tokens=90)
    report.emit("tests", number=1, verdict="PASS", seconds=1.0)
    assert out.getvalue() == (CLEAR_LINE + "... #1 model (turn 2): 3 s elapsed, 40 tokens streamed"
                              + CLEAR_LINE + "... #1 model (turn 2): 4 s elapsed, 90 tokens "
                              "streamed" + CLEAR_LINE + "  Tests... PASS (1.0 s)\n")
    report.emit("heartbeat", live=True, what="", seconds=0)  # cleared already: a prompt stays
    assert out.getvalue().endswith("PASS (1.0 s)\n")
    report.emit("heartbeat", what="#2 build", seconds=15.0)
    assert out.getvalue().endswith("PASS (1.0 s)\n  ... #2 build: 15 s elapsed\n")


def test_quiet_silences_the_heartbeat(quiet_after: None) -> None:
    out = io.StringIO()
    set_verbosity(-1)
    HumanReporter(out).emit("heartbeat", what="#2 build", seconds=15.0)
    HumanReporter(out).emit("heartbeat", live=True, what="#2 build", seconds=15.0)
    assert out.getvalue() == ""
