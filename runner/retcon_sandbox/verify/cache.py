"""The verification cache: what building and testing a tree gave, kept in the repository as git
notes under `refs/notes/retcon-sandbox`, so a tree is built and tested once per set of inputs.

A result is keyed by the tree (the note is attached to the tree object), the build command, the
test command and the environment (`Backend.environment()`: the image's ID for Docker and an
HMAC of the passed variables, plus `Environments.describe()`: the setup commands, its inputs'
patterns and the git metadata, plus the ID of the prepared environment's image the tree ran in;
the inputs' content is in the tree). One note per tree holds JSON lines, one per other key; a
new result replaces the line of its key. Notes are written with plumbing on a temporary index
and the ref moves by compare-and-swap, so the user's working tree and index are never touched,
and two writers never lose each other's results.

Passes and failures are both kept: the same inputs give the same result, so the loop and
`verify` reuse either (a failure's text is what the model reads). `--no-cache` runs everything
again and records the new results. A timeout is reused only under a timeout no longer than the
one it ran with.

Notes travel with the repository (`git push origin refs/notes/retcon-sandbox`) and are read as
untrusted: whoever can write the ref can write a line. So each line carries an HMAC, under the
user's key (userkey.py: a file outside the repository, or RETCON_SANDBOX_NOTES_KEY in CI), of
everything that makes the verdict: the tree, the commands, the environment, the stages and their
verdicts, the failure's text and the tool's version. A line whose HMAC does not verify is a
claim by others: it is shown as such and its tree runs again, unless `--trust-notes`. Lines are
read strictly, in the exact form this tool writes (anything else is foreign and ignored), sizes
are capped, and a notes ref that is not a notes commit is an error that says how to clear it.

Notes from several machines (the jobs of `verify --shard K/N`) merge with `git notes merge -s
cat_sort_uniq`: a merged note is the jobs' lines, sorted and without duplicates. Each line
stands alone (its own HMAC over its own tree and fields), so a merged note is read line by line
like any other; the newest line of a key is found by its time, not its place; and this user's
own result always comes before a claim by others, whatever their times (docs/scaling.md).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, replace
from typing import Any

from retcon_sandbox import __version__, userkey
from retcon_sandbox.errors import GitError
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.userkey import UserKey

REF = "refs/notes/retcon-sandbox"
NOTE_LIMIT = 512 * 1024  # a note larger than this is ignored (and replaced on the next write)
KEYS_KEPT = 16  # lines per tree: results for other commands or environments
FAILURE_KEPT = 16 * 1024  # characters of a failure's text kept (head and tail)
WRITE_ATTEMPTS = 8
FORMAT = 2  # the lines' format: 2 carries an HMAC ("mac")
CLEAR = f"git update-ref -d {REF}"


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
    claimed: bool = False  # from a note whose HMAC did not verify (used under --trust-notes)

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
    return {"v": FORMAT, "build": key.build, "test": key.test, "environment": key.environment,
            "passed": outcome.passed,
            "stages": [{"which": s.which, "command": s.command, "verdict": s.verdict,
                        "passed": s.passed, "timed_out": s.timed_out,
                        "seconds": round(s.seconds, 3)} for s in outcome.stages],
            "failure": None if outcome.failure is None else _keep(outcome.failure),
            "tail": _keep(outcome.tail), "timeout": outcome.timeout,
            "at": int(time.time()), "by": f"retcon-sandbox {__version__}"}


def signed(tree: str, record: dict[str, Any]) -> bytes:
    """What a line's HMAC covers: the tree it is attached to and every field but the HMAC,
    in one canonical form."""
    fields = {k: v for k, v in record.items() if k != "mac"}
    return json.dumps({"tree": tree, "record": fields}, sort_keys=True, ensure_ascii=True,
                      separators=(",", ":"), allow_nan=False).encode()


def seal(tree: str, record: dict[str, Any], key: UserKey) -> dict[str, Any]:
    return {**record, "mac": key.mac(signed(tree, record))}


def authentic(tree: str, record: dict[str, Any], key: UserKey) -> bool:
    mac = record.get("mac")
    if not isinstance(mac, str):
        return False
    try:
        return key.verify(signed(tree, record), mac)
    except ValueError:  # not representable canonically (NaN): not ours
        return False


# The exact forms this tool writes (CommandResult.verdict); anything else is foreign.
# As `CommandResult.verdict` writes them: an exit status 1-255, a signal 1-64, whole seconds
_VERDICT = re.compile(r"PASS|FAIL \((?:exit (?:[1-9][0-9]?|1[0-9]{2}|2[0-4][0-9]|25[0-5])|"
                      r"killed by signal (?:[1-9]|[1-5][0-9]|6[0-4])|"
                      r"timed out after (?P<after>0|[1-9][0-9]{0,5})s)\)")
MAX_TIMEOUT = 86_400  # the largest `timeout` a run can have (spec/settings.py)
LATE_S = 300  # how far past its timeout a stage may end (the sandbox is stopped, then read)
_BY = re.compile(r"retcon-sandbox [0-9A-Za-z.+!_-]{1,40}")
RECORD_KEYS = frozenset({"v", "build", "test", "environment", "passed", "stages", "failure",
                         "tail", "timeout", "at", "by"})
STAGE_KEYS = frozenset({"which", "command", "verdict", "passed", "timed_out", "seconds"})
TEXT_LIMIT = FAILURE_KEPT + 200  # a kept text and the omission line


class Foreign(ValueError):
    """Not a line this tool wrote."""


def _str(value: object, limit: int = TEXT_LIMIT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise Foreign("not a string")
    return value


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value < 0:
        raise Foreign("not a number")
    return float(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise Foreign("not a boolean")
    return value


def _opt(value: object) -> str | None:
    return None if value is None else _str(value)


def _stage(raw: object, key: Key) -> Stage:
    if not isinstance(raw, dict) or set(raw) != STAGE_KEYS:
        raise Foreign("not a stage")
    which = raw["which"]
    if which not in ("build", "test"):
        raise Foreign("not a stage")
    command = _str(raw["command"])
    if command != (key.build if which == "build" else key.test):
        raise Foreign("a command the key does not name")
    verdict = _str(raw["verdict"], 80)
    passed, timed_out = _bool(raw["passed"]), _bool(raw["timed_out"])
    seconds = _num(raw["seconds"])  # a timeout's verdict gives them, whole (`after 600s`)
    form = _VERDICT.fullmatch(verdict)
    if not form or passed != (verdict == "PASS") or timed_out != (form["after"] is not None) \
            or (timed_out and abs(int(form["after"]) - seconds) > 1):
        raise Foreign("not a verdict")
    return Stage(which, command, verdict, passed, timed_out, seconds)


def decode(record: object) -> tuple[Key, Outcome] | None:
    """A line of a note, or None if it is not exactly in the form this tool writes."""
    try:
        if not isinstance(record, dict) or set(record) - {"mac"} != RECORD_KEYS or \
                record["v"] != FORMAT or not _BY.fullmatch(_str(record["by"], 80)):
            return None
        at = record["at"]
        if isinstance(at, bool) or not isinstance(at, int) or \
                not 0 <= at <= time.time() + 86_400:  # never from the future
            return None
        key = Key(_opt(record["build"]), _opt(record["test"]), _str(record["environment"]))
        raw_stages = record["stages"]
        if not isinstance(raw_stages, list) or not 1 <= len(raw_stages) <= 2:
            return None
        stages = tuple(_stage(raw, key) for raw in raw_stages)
        order = [s.which for s in stages]
        planned = [w for w, c in (("build", key.build), ("test", key.test)) if c is not None]
        if order != planned[:len(order)] or any(not s.passed for s in stages[:-1]):
            return None
        failure = _opt(record["failure"])
        passed = _bool(record["passed"])
        if passed != (failure is None) or passed != (all(s.passed for s in stages)
                                                     and len(order) == len(planned)):
            return None
        timeout = _num(record["timeout"])
        if not 0 < timeout <= MAX_TIMEOUT or any(st.seconds > timeout + LATE_S for st in stages):
            return None
        return key, Outcome(stages, failure, _str(record["tail"]), timeout, cached=True)
    except (KeyError, Foreign):
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


def newest_first(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A note's records, newest first: by their time (`at`), later lines first among equals.
    A note that `git notes merge -s cat_sort_uniq` made of several jobs' notes has their lines
    sorted as text, not in the order they were written; a record without a valid time sorts
    last (it is not one this tool wrote, and `decode` refuses it anyway)."""
    def at(record: dict[str, Any]) -> int:
        value = record.get("at")
        return value if isinstance(value, int) and not isinstance(value, bool) else -1
    return sorted(reversed(records), key=at, reverse=True)


def _same_key(record: dict[str, Any], key: Key) -> bool:
    return (record.get("build"), record.get("test"), record.get("environment")) == \
        (key.build, key.test, key.environment)


# --- the cache -------------------------------------------------------------------------------


class Cache:
    """Results by tree, read from and written to the repository's notes. `read=False`
    (`--no-cache`) runs everything again; results are written either way. Only lines this
    user's key authenticates are believed, unless `trust` (`--trust-notes`)."""

    def __init__(self, repo: Repo, read: bool = True, write: bool = True,
                 key: UserKey | None = None, trust: bool = False) -> None:
        self.repo = repo
        self.read = read
        self.write = write
        self.trust = trust
        self.problem: str | None = None
        self._key = key
        self._commit: str | None = None
        self._notes: dict[str, str] | None = None

    @property
    def key(self) -> UserKey:
        if self._key is None:
            self._key = userkey.load()
        return self._key

    def check(self) -> None:
        """Before a run: the key can be had, and the notes ref, if any, can be read."""
        _ = self.key
        self._load()

    def _load(self) -> dict[str, str]:
        commit, exists = self.repo.ref_state(REF)
        if commit is None and exists:
            raise corrupted("does not point to a commit")
        if self._notes is None or commit != self._commit:
            self._commit = commit
            try:
                self._notes = self.repo.notes_at(commit) if commit else {}
            except GitError as exc:
                raise corrupted(f"is not a notes commit ({exc.message})") from None
        return self._notes

    def _records(self, tree: str, notes: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """`tree`'s note, as `notes` (the notes just loaded) or the ref now has it."""
        blob = (self._load() if notes is None else notes).get(tree)
        data = self.repo.small_blob(blob, NOTE_LIMIT) if blob else None
        return parse_note(data) if data else []

    def _found(self, tree: str, key: Key, timeout: float, notes: dict[str, str] | None = None
               ) -> list[tuple[Outcome, bool]]:
        """The usable results of `tree` under `key`, newest first, each with whether this
        user's key authenticates it (from `notes`, if just loaded)."""
        found = []
        for record in newest_first(self._records(tree, notes)):
            decoded = decode(record)
            if decoded and decoded[0] == key and decoded[1].usable(timeout):
                found.append((decoded[1], authentic(tree, record, self.key)))
        return found

    def recorded(self, tree: str) -> list[tuple[Key, Outcome, bool]]:
        """Every result kept for `tree`, whatever its key, newest first, each with whether this
        user's key authenticates it (for a report: the run that made them is over)."""
        found = []
        for record in newest_first(self._records(tree)):
            decoded = decode(record)
            if decoded is not None:
                key, outcome = decoded
                ours = authentic(tree, record, self.key)
                found.append((key, outcome if ours else replace(outcome, claimed=True), ours))
        return found

    def get(self, tree: str, key: Key, timeout: float) -> Outcome | None:
        """A result this user recorded; under `trust`, also one claimed by others."""
        return self.lookup(tree, key, timeout)[0]

    def claim(self, tree: str, key: Key, timeout: float) -> Outcome | None:
        """The newest result of `tree` under `key` that others claim (its HMAC does not
        verify), whether or not it is used."""
        return self.lookup(tree, key, timeout)[1]

    def lookup(self, tree: str, key: Key, timeout: float
               ) -> tuple[Outcome | None, Outcome | None]:
        """`get` and `claim` at once, from one reading of the notes."""
        if not self.read:
            return None, None
        found = self._found(tree, key, timeout)
        claim = _claim(found)
        mine = next((outcome for outcome, ours in found if ours), None)
        if mine is not None or not self.trust:
            return mine, claim  # ours first: a claim, even a newer one, never hides our own
        return next((replace(outcome, claimed=True) for outcome, _ in found), None), claim

    def put(self, tree: str, key: Key, outcome: Outcome, timeout: float | None = None
            ) -> Outcome | None:
        """Record a result, replacing an older one under the same key. Another writer moving
        the ref in between is retried; losing the race repeatedly only loses this line. A
        repository that cannot be written stops the writing, not the run (`problem` says
        why). With `timeout`: what `claim` answers just before the write, from the same
        reading of the notes as the write's (else None)."""
        notes = None
        claim = None
        if timeout is not None and self.read:
            notes = self._load()
            claim = _claim(self._found(tree, key, timeout, notes))
        if not self.write:
            return claim
        try:
            self._put(tree, key, outcome, notes)
        except GitError as exc:
            self.write = False
            self.problem = exc.message
        return claim

    def _put(self, tree: str, key: Key, outcome: Outcome, notes: dict[str, str] | None
             ) -> None:
        """`notes`: as just loaded, for the first attempt."""
        line = seal(tree, encode(key, outcome), self.key)
        for _ in range(WRITE_ATTEMPTS):
            notes = self._load() if notes is None else notes
            kept = [r for r in self._records(tree, notes)
                    if not _same_key(r, key)][-(KEYS_KEPT - 1):]
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
            self._notes = notes = None  # someone else wrote: read again and retry


def _claim(found: list[tuple[Outcome, bool]]) -> Outcome | None:
    """The newest of `found` that others claim (its HMAC does not verify)."""
    return next((replace(o, claimed=True) for o, ours in found if not ours), None)


def corrupted(why: str) -> GitError:
    return GitError(f"the verification cache's ref {REF} {why}",
                    f"Clear it with `{CLEAR}` (this forgets every cached result; nothing "
                    "else is touched), then rerun.")
