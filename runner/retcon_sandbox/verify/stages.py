"""Building and testing a tree in a sandbox: the one place that runs the project's commands for
the loop, and turns their results into events and into the failure text the model reads.

Results go through the verification cache (`vcache`): a tree whose result is known for the same
commands and environment is not built or tested again, and needs no sandbox at all.

A command the sandbox cannot find or execute (exit 126 or 127) is a configuration error that
names the command, not a failure of the code for the model to fix.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace

from retcon_sandbox import progress, threads
from retcon_sandbox.backends.api import CommandResult, Sandbox
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import ConfigError
from retcon_sandbox.report import Reporter
from retcon_sandbox.verify.cache import Cache, Key, Outcome, Stage

TAIL_LINES = 15
NOT_RUNNABLE = (126, 127)
CACHED_NOTE = ("\n[a cached result: this tree gave it in an earlier run, with the same commands "
               "and environment]")


@dataclass(frozen=True)
class Commands:
    build: str | None
    test: str | None
    timeout: float
    skip: frozenset[str] = frozenset()

    def get(self, which: str) -> str | None:
        return self.build if which == "build" else self.test

    def planned(self, which: str) -> str | None:
        """The command a verification runs for `which`: None when skipped or not configured."""
        return None if which in self.skip else self.get(which)


STAGES = (("build", "build", "Build"), ("test", "tests", "Tests"))
EVENTS = {which: event for which, event, _ in STAGES}

Notify = Callable[[str, Stage | None], None]  # a stage's result, or None when it does not run


def describe(result: CommandResult | None, what: str) -> str:
    if result is None:
        return f"{what}: skipped (no {what.lower()} command configured)"
    note = f"\n[output: {result.total_bytes} bytes in all; head and tail kept]" \
        if result.truncated else ""
    return f"{what} {result.verdict()} in {result.seconds:.1f}s\n$ {result.command}\n" \
           f"{result.output}{note}"


def tail_of(output: str) -> str:
    return "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])


def not_runnable(result: CommandResult, which: str) -> ConfigError:
    tail = "".join(f"\n    {line}" for line in result.output.rstrip().splitlines()[-5:])
    return ConfigError(
        f"the {which} command cannot run in the sandbox (exit {result.exit_code}): "
        f"{result.command}{tail}",
        f"Check --{which} (or [sandbox] {which}) and the image: the command must exist in it. "
        "Tools the project needs can be installed by [sandbox] setup.")


def run_command(box: Sandbox, command: str, which: str, timeout: float) -> CommandResult:
    result = box.run(command, timeout)
    if result.exit_code in NOT_RUNNABLE and not result.timed_out:
        raise not_runnable(result, which)
    return result


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_SYNTAX = set("$`;&|<>(){}*?[\\")


def first_program(command: str) -> str | None:
    """The program a shell command starts with, when that can be told without running it (no
    expansion, no compound command, no PATH of its own)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return None
    for word in words:
        if _ASSIGNMENT.match(word):
            if word.startswith("PATH="):
                return None
            continue
        if word.startswith("-") or _SHELL_SYNTAX.intersection(word):
            return None
        return word
    return None


def check_runnable(box: Sandbox, commands: Commands) -> None:
    """Before anything is recorded: the program each planned command starts with exists in the
    sandbox (a command that is not found is a configuration error now, not after the first
    commit). The tests' program is checked only when no build runs first, which may make it."""
    for which, _, _ in STAGES:
        command = commands.planned(which)
        program = first_program(command) if command else None
        if which == "test" and commands.planned("build"):
            return
        if command is None or program is None:
            continue
        quoted = shlex.quote(program)
        probe = f"test -f {quoted} && test -x {quoted}" if "/" in program else \
            f"command -v {quoted} >/dev/null"
        result = box.run(probe, commands.timeout)
        if not result.passed and not result.timed_out:
            raise ConfigError(
                f"the {which} command cannot run in the sandbox ({program}: not found, or not "
                f"an executable file): {command}", not_runnable(result, which).hint)


@dataclass(frozen=True)
class Where:
    """Whose build and tests `run_stages` runs, for their phases (progress.phase): the reporter
    of their phase events (None: no events, the heartbeat only), the commit's number, how a
    line names it (`#3 a68f6c0`), and its tree."""

    report: Reporter | None = None
    number: int | None = None
    name: str = ""
    tree: str | None = None

    def phase(self, event: str) -> contextlib.AbstractContextManager[progress.Activity]:
        what = f"{self.name} {event}" if self.name else ""
        return progress.phase(self.report, event, self.number, what, key=self.tree)


def run_stages(box: Callable[[], Sandbox], commands: Commands,
               notify: Notify | None = None, at: Where = Where()) -> Outcome:
    """Build, then tests (each when planned), in the sandbox `box()` opens on first use."""
    stages: list[Stage] = []
    for which, event, title in STAGES:
        command = commands.planned(which)
        if command is None:
            if notify:
                notify(which, None)
            continue
        sandbox = box()
        with at.phase(event):
            result = run_command(sandbox, command, which, commands.timeout)
        stage = Stage(which, command, result.verdict(), result.passed, result.timed_out,
                      result.seconds)
        stages.append(stage)
        if notify:
            notify(which, stage)
        if not result.passed:
            return Outcome(tuple(stages), describe(result, title), tail_of(result.output),
                           commands.timeout)
    return Outcome(tuple(stages), None, "", commands.timeout)


def overlapped(box: Sandbox, commands: Commands, notify: Notify,
               alongside: Callable[[], None], at: Where = Where()) -> Outcome:
    """`run_stages` in a thread of its own, which does sandbox I/O only, while `alongside` runs
    in this one; the stages' events are given to `notify` here, afterwards, in their order. If
    `alongside` raises, so does this, at once: the stages stop when their sandbox is removed."""
    events: list[tuple[str, Stage | None]] = []
    outcome = threads.later(lambda: run_stages(lambda: box, commands,
                                               lambda w, s: events.append((w, s)), at),
                            "retcon-verify")
    alongside()
    try:
        return outcome()  # raises what the stages raised, after their events are given
    finally:
        for which, stage in events:
            notify(which, stage)


def replay(outcome: Outcome, commands: Commands, notify: Notify) -> None:
    """A known outcome's stages, in the order a run would report them."""
    for which, _, _ in STAGES:
        if commands.planned(which) is None:
            notify(which, None)
            continue
        stage = outcome.stage(which)
        if stage is None:
            return
        notify(which, stage)
        if not stage.passed:
            return


Prepared = Callable[[str], str | None]  # a tree's prepared environment: its image ID, "" when
# it needs none, None when it is not prepared yet (then no cached result can apply)


class Verifier:
    def __init__(self, commands: Commands, report: Reporter, cache: Cache | None = None,
                 environment: str = "", prepared: Prepared | None = None) -> None:
        self.commands = commands
        self.report = report
        self.cache = cache
        self.environment = environment
        self.passed_here: set[str] = set()  # trees this process built and tested, that passed
        self.prepared = prepared
        self.claims: dict[str, Outcome] = {}  # tree -> what others claimed, seen before it ran
        self.tested: set[str] = set()  # trees whose tests ran or were replayed from the cache

    def saw(self, tree: str, outcome: Outcome) -> None:
        """Count `tree` among those the test command checked (for the summary)."""
        if outcome.stage("test") is not None:
            self.tested.add(tree)

    @property
    def key(self) -> Key:
        return Key(self.commands.planned("build"), self.commands.planned("test"),
                   self.environment)

    def key_for(self, tree: str) -> Key | None:
        """The cache key of `tree`: `key`, plus the ID of the prepared environment's image it
        runs in (a setup run again, or an image removed, is another environment). None when
        that environment is not prepared yet."""
        image = self.prepared(tree) if self.prepared is not None else ""
        if image is None:
            return None
        return replace(self.key, environment=self.environment + f" prepared:{image}") \
            if image else self.key

    @property
    def runs_anything(self) -> bool:
        return any(self.commands.planned(which) for which, _, _ in STAGES)

    def lookup(self, tree: str) -> Outcome | None:
        """The cached outcome of `tree` under these commands and this environment."""
        if self.cache is None or not self.runs_anything:
            return None
        key = self.key_for(tree)
        if key is None:
            return None
        found, claim = self.cache.lookup(tree, key, self.commands.timeout)  # one reading
        if found is None or found.claimed:
            self._note_claim(tree, claim)
        return found

    def _note_claim(self, tree: str, claim: Outcome | None) -> None:
        """Keep what others claim for `tree` (notes this user's key does not authenticate),
        before our own result replaces it."""
        if claim is not None and tree not in self.claims:
            self.claims[tree] = claim

    def record(self, tree: str, outcome: Outcome, key: Key | None = None) -> None:
        if outcome.passed and outcome.stages and not outcome.cached:
            self.passed_here.add(tree)
        if self.cache is not None and outcome.stages and not outcome.cached:
            key = key or self.key_for(tree)
            if key is not None:  # the claim, read with the notes the write replaces
                noting = None if tree in self.claims else self.commands.timeout
                self._note_claim(tree, self.cache.put(tree, key, outcome, noting))

    def baseline(self, tree: str, box: Callable[[], Sandbox]) -> Outcome:
        """Build, then tests, of the base commit's `tree` (in `box()`, opened when needed):
        through the cache like any commit, reported as one `base_check` event."""
        outcome = self.lookup(tree)
        if outcome is None:
            outcome = run_stages(box, self.commands, at=Where(self.report, name="base commit"))
            self.record(tree, outcome)
        failed = next((s for s in outcome.stages if not s.passed), None)
        self.report.emit("base_check", passed=outcome.passed, cached=outcome.cached,
                         verdict=", ".join(f"{EVENTS[s.which]} {s.verdict}"
                                           for s in outcome.stages),
                         failed=EVENTS[failed.which] if failed else None,
                         seconds=round(outcome.seconds, 3))
        return outcome

    def run(self, state: WorkState, which: str) -> CommandResult | None:
        """One command, as a tool call of the model (no events, no cache)."""
        command = self.commands.get(which)
        if not command:
            return None
        return run_command(state.command_box, command, which, self.commands.timeout)

    def check(self, state: WorkState, number: int,
              alongside: Callable[[], None] | None = None) -> str | None:
        """Build, then tests, of commit `number`: the failure as text for the model, or None
        when both pass. A cached outcome needs no sandbox. `alongside`: work for this thread
        while the commands run in another (`overlapped`); not called for a cached outcome."""
        tree = state.tree()
        outcome = self.lookup(tree)
        cached = outcome is not None

        def notify(which: str, stage: Stage | None) -> None:
            event = EVENTS[which]
            if stage is None:
                why = "--skip" if which in self.commands.skip else f"no {which} command"
                self.report.emit(event, number=number, verdict=f"skipped ({why})")
            elif cached:
                claimed = {"claimed": True} if outcome is not None and outcome.claimed else {}
                self.report.emit(event, number=number, verdict=stage.verdict, cached=True,
                                 **claimed)
            else:
                self.report.emit(event, number=number, verdict=stage.verdict,
                                 seconds=stage.seconds)

        at = Where(self.report, number)
        if outcome is not None:
            replay(outcome, self.commands, notify)
        elif alongside is not None and self.runs_anything:
            outcome = overlapped(state.command_box, self.commands, notify, alongside, at)
            self.record(tree, outcome)
        else:
            outcome = run_stages(lambda: state.command_box, self.commands, notify, at)
            self.record(tree, outcome)
        self.saw(tree, outcome)
        if outcome.failure is None:
            return None
        self.report.emit("failure_output", number=number, tail=outcome.tail)
        return outcome.failure + (CACHED_NOTE if cached else "")
