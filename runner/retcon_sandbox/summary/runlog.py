"""A run's events, kept for `report`: `execute` appends the events that say what it did and
where its time went (not the output lines) to `<spec>.events.jsonl` in the state directory, one
JSON object per line, from a `run_start` to a `run_end`.

The file is an aid, never a condition: a run that cannot write it goes on. It lives in the
repository's `.git`, which is not trusted, so reading it is strict: a line that is not an
object with an event name, a time and a run id is skipped, and only the end of a large file is
read.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from pathlib import Path
from typing import Any

from retcon_sandbox.errors import RetconError
from retcon_sandbox.report import Reporter
from retcon_sandbox.spec.statedir import open_append

KEPT = frozenset({"spec", "commit_start", "sandbox", "setup_ready", "build", "tests",
                  "fix_attempt", "fix_done", "stuck", "squash_tree", "final_tree", "tree_check",
                  "summary", "base_check"})
READ_LIMIT = 8 * 1024 * 1024  # bytes read from the end of the file


class RunLog:
    """A reporter that passes every event on and keeps the ones in KEPT, in memory and in the
    file."""

    def __init__(self, inner: Reporter, path: Path) -> None:
        self.inner = inner
        self.run_id = inner.run_id
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._fd: int | None = None
        self._broken = False
        self._keep("run_start", {})

    def emit(self, event: str, **data: Any) -> None:
        self.inner.emit(event, **data)
        if event in KEPT:
            self._keep(event, data)

    def close(self) -> None:
        self._keep("run_end", {})
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _keep(self, event: str, data: dict[str, Any]) -> None:
        """Keep an event; the file is written from the first event after `run_start` on (a run
        refused before it began leaves nothing)."""
        record = {"event": event, "time": round(time.time(), 3), "run": self.run_id, **data}
        self.events.append(record)
        if self._broken or len(self.events) == 1 or \
                (self._fd is None and event == "run_end"):
            return
        lines = "".join(json.dumps(r, default=str) + "\n"  # ASCII: any name survives
                        for r in (self.events if self._fd is None else [record]))
        try:
            if self._fd is None:
                self._fd = open_append(self.path)
            os.write(self._fd, lines.encode("ascii"))
        except (OSError, RetconError):
            self._broken = True  # the report loses its timeline; the run goes on


def _valid(record: object) -> bool:
    if not isinstance(record, dict):
        return False
    moment = record.get("time")
    return isinstance(record.get("event"), str) and isinstance(record.get("run"), str) and \
        isinstance(moment, int | float) and not isinstance(moment, bool) and \
        math.isfinite(moment)


def read_tail(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of a regular file, never through a symlink; nothing when it is
    missing, unreadable or something else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return b""
        os.lseek(fd, max(0, info.st_size - limit), os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)[-limit:]
    except OSError:
        return b""
    finally:
        os.close(fd)


def json_lines(data: bytes) -> list[Any]:
    """Each line that is JSON, decoded; the others skipped."""
    found = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every valid event in the file (the end of it, when large)."""
    return [r for r in json_lines(read_tail(path, READ_LIMIT)) if _valid(r)]


def last_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the newest run that has a start: from its `run_start` on."""
    start = max((i for i, e in enumerate(events) if e["event"] == "run_start"), default=None)
    if start is None:
        return []
    run = events[start]["run"]
    return [e for e in events[start:] if e["run"] == run]
