"""The verification cache: what building and testing a tree gave, kept in the repository as git
notes under `refs/notes/retcon-sandbox`, so a tree is built and tested once per set of inputs.

A result is keyed by the tree (the note is attached to the tree object), the build command, the
test command and the environment (`Backend.environment()`: the image's ID for Docker, plus
`Environments.describe()`: the setup commands, its inputs' patterns and the git metadata; the
inputs' content is in the tree). One note per tree holds JSON lines, one per other key; a new result
replaces the line of its key. Notes are written with plumbing on a temporary index and the ref
moves by compare-and-swap, so the user's working tree and index are never touched, and two
writers never lose each other's results.

Passes and failures are both kept: the same inputs give the same result, so the loop and
`verify` reuse either (a failure's text is what the model reads). `--no-cache` runs everything
again and records the new results. A timeout is reused only under a timeout no longer than the
one it ran with.

Notes travel with the repository (`git push origin refs/notes/retcon-sandbox`) and are read as
untrusted: malformed lines are ignored, sizes are capped, and whoever can write the ref can claim
a result, which `--no-cache` disregards.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from retcon_sandbox import __version__
from retcon_sandbox.errors import GitError
from retcon_sandbox.repo.gitrepo import Repo

REF = "refs/notes/retcon-sandbox"
NOTE_LIMIT = 512 * 1024  # a note larger than this is ignored (and replaced on the next write)
KEYS_KEPT = 16  # lines per tree: results for other commands or environments
FAILURE_KEPT = 16 * 1024  # characters of a failure's text kept (head and tail)
WRITE_ATTEMPTS = 8


@dataclass(frozen=True)
class Key:
    """What a tree's result depends on besides the tree. A command that is not run (none
    configured, or skipped) is None."""

    build: str | None
    test: str | None
    environment: str


@dataclass(frozen=True)
class Stage:
    """One command's result."""

    which: str  # "build" | "test"
    command: str
    verdict: str  # CommandResult.verdict(): "PASS", "FAIL (exit 1)", ...
    passed: bool
    timed_out: bool
    seconds: float


@dataclass(frozen=True)
class Outcome:
    """Building and testing one tree: the stages that ran (a failing build ends it), and for a
    failure, the text the model reads and the tail of the output."""

    stages: tuple[Stage, ...]
    failure: str | None
    tail: str
    timeout: float
    cached: bool = False

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages)

    def stage(self, which: str) -> Stage | None:
        return next((s for s in self.stages if s.which == which), None)

    def usable(self, timeout: float) -> bool:
        """A timeout says nothing about a run allowed more time."""
        return not any(s.timed_out for s in self.stages) or timeout <= self.timeout


# --- the note's lines ------------------------------------------------------------------------


def _keep(text: str) -> str:
    if len(text) <= FAILURE_KEPT:
        return text
    head, tail = FAILURE_KEPT // 4, FAILURE_KEPT - FAILURE_KEPT // 4
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[-tail:]}"


def encode(key: Key, outcome: Outcome) -> dict[str, Any]:
    return {"build": key.build, "test": key.test, "environment": key.environment,
            "passed": outcome.passed,
            "stages": [{"which": s.which, "command": s.command, "verdict": s.verdict,
                        "passed": s.passed, "timed_out": s.timed_out,
                        "seconds": round(s.seconds, 3)} for s in outcome.stages],
            "failure": None if outcome.failure is None else _keep(outcome.failure),
            "tail": _keep(outcome.tail), "timeout": outcome.timeout,
            "at": int(time.time()), "by": f"retcon-sandbox {__version__}"}


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("not a string")
    return value


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    return float(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("not a boolean")
    return value


def _opt(value: object) -> str | None:
    return None if value is None else _str(value)


def decode(record: object) -> tuple[Key, Outcome] | None:
    """A line of a note, or None if it is not one we can trust the shape of."""
    try:
        if not isinstance(record, dict):
            return None
        key = Key(_opt(record.get("build")), _opt(record.get("test")),
                  _str(record.get("environment")))
        raw_stages = record.get("stages")
        if not isinstance(raw_stages, list) or len(raw_stages) > 2:
            return None
        stages = []
        for raw in raw_stages:
            if not isinstance(raw, dict) or raw.get("which") not in ("build", "test"):
                return None
            stages.append(Stage(_str(raw["which"]), _str(raw.get("command")),
                                _str(raw.get("verdict")), _bool(raw.get("passed")),
                                _bool(raw.get("timed_out")), _num(raw.get("seconds"))))
        failure = _opt(record.get("failure"))
        if _bool(record.get("passed")) != (failure is None) or \
                (failure is None) != all(s.passed for s in stages):
            return None
        return key, Outcome(tuple(stages), failure, _str(record.get("tail")),
                            _num(record.get("timeout")), cached=True)
    except (KeyError, ValueError):
        return None


def parse_note(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a note, skipping lines that are not."""
    records = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _same_key(record: dict[str, Any], key: Key) -> bool:
    return (record.get("build"), record.get("test"), record.get("environment")) == \
        (key.build, key.test, key.environment)


# --- the cache -------------------------------------------------------------------------------


class Cache:
    """Results by tree, read from and written to the repository's notes. `read=False`
    (`--no-cache`) runs everything again; results are written either way."""

    def __init__(self, repo: Repo, read: bool = True, write: bool = True) -> None:
        self.repo = repo
        self.read = read
        self.write = write
        self.problem: str | None = None
        self._commit: str | None = None
        self._notes: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        commit = self.repo.ref_sha(REF)
        if self._notes is None or commit != self._commit:
            self._commit = commit
            self._notes = self.repo.notes_at(commit) if commit else {}
        return self._notes

    def _records(self, tree: str) -> list[dict[str, Any]]:
        blob = self._load().get(tree)
        data = self.repo.small_blob(blob, NOTE_LIMIT) if blob else None
        return parse_note(data) if data else []

    def get(self, tree: str, key: Key, timeout: float) -> Outcome | None:
        if not self.read:
            return None
        for record in reversed(self._records(tree)):  # the newest line wins
            decoded = decode(record)
            if decoded and decoded[0] == key and decoded[1].usable(timeout):
                return decoded[1]
        return None

    def put(self, tree: str, key: Key, outcome: Outcome) -> None:
        """Record a result, replacing an older one under the same key. Another writer moving
        the ref in between is retried; losing the race repeatedly only loses this line. A
        repository that cannot be written stops the writing, not the run (`problem` says
        why)."""
        if not self.write:
            return
        try:
            self._put(tree, key, outcome)
        except GitError as exc:
            self.write = False
            self.problem = exc.message

    def _put(self, tree: str, key: Key, outcome: Outcome) -> None:
        line = encode(key, outcome)
        for _ in range(WRITE_ATTEMPTS):
            self._load()
            kept = [r for r in self._records(tree) if not _same_key(r, key)][-(KEYS_KEPT - 1):]
            data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n"
                           for r in [*kept, line]).encode()
            blob = self.repo.write_blob(data)
            new = self.repo.write_note(REF, tree, blob, self._commit,
                                       f"verified tree {tree[:12]}")
            if new is not None:
                self._commit = new
                assert self._notes is not None
                self._notes[tree] = blob
                return
            self._notes = None  # someone else wrote: read again and retry
