"""What runs now, and for how long: the one place a long step announces itself, so that no
minute of a run is silent.

A step runs inside `phase(report, name, number)`: `setup`, `sandbox`, `model`, `build`, `tests`
(and `image` for an image build). The reporter gets a `phase_start` event and, when the step
ends, a `phase_end` with its `seconds` (and the `tokens` a streaming model sent): the timeline
of a run in its --json stream, for whatever summarises it. While steps run, `heartbeat(report)`
(one per process, started by the command) looks at them: off a terminal it emits a `heartbeat`
event for each step that has run `every` seconds (15, RETCON_SANDBOX_HEARTBEAT) since it began
or since its last line, so a CI log gets a line at most every 15 s per step and none for a
short one; on a terminal (`live`) it emits one every second, for the human reporter's live line.
A thread's innermost step is the one shown: what that thread is doing now.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from retcon_sandbox import threads
from retcon_sandbox.errors import env_number

HEARTBEAT_S = 15.0
LIVE_S = 1.0  # a live line's refresh


class Reporter(Protocol):  # report.Reporter's shape (report imports this module)
    def emit(self, event: str, **data: Any) -> None: ...


@dataclass
class Activity:
    """One step running: its phase, its commit (if any), what a line calls it, since when."""

    phase: str
    number: int | None
    what: str
    started: float = field(default_factory=time.monotonic)
    key: str | None = None  # what the step works on, for a display to find it (a tree)
    tokens: int = 0  # streamed so far, for a model's answer
    last: float = 0.0  # when a line last spoke for it (its start, a heartbeat, its own output)
    thread: int = field(default_factory=threading.get_ident)

    def __post_init__(self) -> None:
        self.last = self.started

    def touch(self) -> None:
        """The step printed something of its own: no heartbeat is owed for a while."""
        self.last = time.monotonic()

    def fields(self, now: float) -> dict[str, Any]:
        data: dict[str, Any] = {"phase": self.phase, "what": self.what,
                                "seconds": round(now - self.started, 1)}
        if self.number is not None:
            data["number"] = self.number
        if self.tokens:
            data["tokens"] = self.tokens
        return data


_lock = threading.Lock()
_running: list[Activity] = []
_local = threading.local()


def running() -> list[Activity]:
    with _lock:
        return list(_running)


def current() -> Activity | None:
    """This thread's innermost step."""
    stack: list[Activity] = getattr(_local, "stack", [])
    return stack[-1] if stack else None


def streamed(tokens: int) -> None:
    """A streaming model has sent `tokens` so far (for this thread's step)."""
    activity = current()
    if activity is not None:
        activity.tokens = tokens


@contextlib.contextmanager
def phase(report: Reporter | None, name: str, number: int | None = None, what: str = "",
          key: str | None = None, **data: Any) -> Iterator[Activity]:
    """Run a step as `name` of commit `number`: announced to `report` (phase_start, then
    phase_end with its seconds), and watched by the heartbeat while it runs. `what`: how a
    line names it (default `#3 tests`)."""
    label = what or (f"#{number} {name}" if number is not None else name)
    activity = Activity(name, number, label, key=key)
    where = {} if number is None else {"number": number}
    if report is not None:
        report.emit("phase_start", phase=name, **where, **data)
    stack: list[Activity] = _local.__dict__.setdefault("stack", [])
    stack.append(activity)
    with _lock:
        _running.append(activity)
    try:
        yield activity
    finally:
        stack.remove(activity)
        with _lock:
            _running.remove(activity)
        if report is not None:
            tokens = {"tokens": activity.tokens} if activity.tokens else {}
            report.emit("phase_end", phase=name, **where,
                        seconds=round(time.monotonic() - activity.started, 3), **tokens)


def shown(activities: list[Activity]) -> list[Activity]:
    """Each thread's innermost step, oldest first."""
    innermost: dict[int, Activity] = {}
    for activity in activities:
        innermost[activity.thread] = activity  # appended in order: the last is the innermost
    return sorted(innermost.values(), key=lambda a: a.started)


def due(activities: list[Activity], now: float, every: float) -> list[Activity]:
    """The steps owed a line: silent for `every` seconds (since they began, or since their
    last line). Each one returned is counted as spoken for."""
    owed = [a for a in shown(activities) if now - a.last >= every]
    for activity in owed:
        activity.last = now
    return owed


def line(data: dict[str, Any]) -> str:
    """A heartbeat in words: `  ... #3 tests: 45 s elapsed`, `..., 812 tokens streamed`."""
    tokens = f", {data['tokens']:,} tokens streamed" if data.get("tokens") else ""
    return f"  ... {data['what']}: {data['seconds']:.0f} s elapsed{tokens}"


def interval() -> float:
    return env_number("RETCON_SANDBOX_HEARTBEAT", HEARTBEAT_S,
                      meaning="the seconds between progress lines of a long step")


_beating = threading.Event()  # one heartbeat per process: an inner one leaves it to it


@contextlib.contextmanager
def heartbeat(report: Reporter, live: bool = False, every: float | None = None
              ) -> Iterator[None]:
    """Watch the running steps until the block ends, emitting `heartbeat` events to `report`
    (see the module's docstring). `live`: one event a second for the newest step (`live`
    set; `what` empty when nothing runs, to clear the line)."""
    if _beating.is_set():
        yield
        return
    every = interval() if every is None else every
    done = threading.Event()
    showing = [False]  # a live line is on the screen

    def tick() -> None:
        now = time.monotonic()
        if not live:
            for activity in due(running(), now, every):
                report.emit("heartbeat", **activity.fields(now))
            return
        newest = shown(running())[-1:]
        if newest or showing[0]:
            report.emit("heartbeat", live=True, **(newest[0].fields(now) if newest
                                                   else {"what": "", "seconds": 0}))
        showing[0] = bool(newest)

    def beat() -> None:
        while not done.wait(LIVE_S if live else min(every, LIVE_S) / 4):
            tick()

    _beating.set()
    thread = threads.start(beat, "retcon-heartbeat")
    try:
        yield
    finally:
        done.set()
        thread.join()
        _beating.clear()
        if showing[0]:  # the live line goes with the block
            report.emit("heartbeat", live=True, what="", seconds=0)
