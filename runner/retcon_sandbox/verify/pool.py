"""Building and testing many trees at once, N at a time: the `verify` command and the squash
check.

Known results come from the cache first and need no sandbox. N worker threads take the trees in
turn; each runs one tree's commands at a time. While it does, the sandbox of the tree it takes
next is already being made ready (`ahead`) on a thread of its own: the worker's last used
sandbox, wiped (`reuse`), or a fresh one. A used sandbox takes another tree only when the tree
needs the same environment and the wipe leaves it as it started (`Environments.refill`: no
process, file, socket or SysV IPC object of the last tree's is left, so nothing one tree's
commands leave can reach another tree's verdict); otherwise it is removed, and a fresh container
opened.
So a worker alternates between two containers. Sandboxes are removed by other threads: the
worker waits for no removal. git is used by one thread at a time (the tree's tar is read under
a lock into a spool, and unpacked outside it; results are recorded by the calling thread). With
several engines (`--engine` given more than once), worker k uses engine k mod E. When anything
fails (a configuration error, Ctrl-C), no new sandbox starts, the running ones are removed
(`Backend.reap` on every engine), and the error goes on.

The git metadata is made in its own exec while the tree before runs, when a core is left for
it; when the workers take every core (or nothing is made ready ahead), in the exec of the
tree's first command instead, which saves an exec's CPU per tree (`prepare_with_command`).

`phases` adds up where the time goes (see `environments.Phases`); RETCON_SANDBOX_VERIFY_AHEAD=0
turns the look-ahead off, RETCON_SANDBOX_VERIFY_PREPARE=exec or =command chooses where the git
metadata is made, and `verify --no-reuse` turns the reuse off (the bench compares them).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from retcon_sandbox import threads
from retcon_sandbox.backends.api import Sandbox
from retcon_sandbox.backends.environments import Environments, Opened, Phases
from retcon_sandbox.backends.envkeys import Place
from retcon_sandbox.errors import RetconError
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import Reporter
from retcon_sandbox.verify.cache import Outcome
from retcon_sandbox.verify.stages import Verifier, Where, run_stages

TICK = 0.25  # seconds between calls of `tick` while waiting (a live display redraws)


@dataclass(frozen=True)
class Item:
    tree: str
    label: str  # the sandbox's label
    at: Place | None = None  # the commit the tree is (its git metadata's version)
    name: str = ""  # how a progress line names it (`#3 a68f6c0`)
    number: int | None = None  # the first commit of the range with this tree, for its phases


Started = Callable[[Item], None]  # called from a worker thread: keep it to plain assignments
Finished = Callable[[Item, Outcome], None]


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Stopped(Exception):
    """A queued item after the batch was stopped."""


def _constant(box: Sandbox) -> Callable[[], Sandbox]:
    return lambda: box


def ahead_default() -> bool:
    return os.environ.get("RETCON_SANDBOX_VERIFY_AHEAD", "1").strip() != "0"


def prepare_with_command(jobs: int, ahead: bool) -> bool:
    """Whether a tree's git metadata is made in the exec of its first command: when nothing is
    made ready ahead, or when the workers take every core, so that an exec of its own would
    take CPU from the commands; RETCON_SANDBOX_VERIFY_PREPARE (`exec`, `command`) decides."""
    chosen = os.environ.get("RETCON_SANDBOX_VERIFY_PREPARE", "").strip()
    if chosen in ("exec", "command"):
        return chosen == "command"
    return not ahead or jobs >= default_jobs()


_Ready = tuple[contextlib.ExitStack, Opened]  # an open sandbox, and how to remove it


class _Remover:
    """Removes used sandboxes on threads of their own, and keeps what a removal raised: a
    container left behind is reported once the batch is done, not lost with its future."""

    def __init__(self, workers: int) -> None:
        self._executor = threads.pool(workers, "retcon-remove")
        self._removals: list[Future[None]] = []

    def submit(self, close: Callable[[], None]) -> None:
        self._removals.append(self._executor.submit(close))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    def raise_first(self) -> None:
        for removal in self._removals:
            error = removal.exception()
            if isinstance(error, RetconError) and not error.hint:
                error.hint = ("Every tree's result is recorded: run verify again to see them. "
                              "`retcon-sandbox clean` removes what a finished run left behind.")
            if error is not None:
                raise error


def _remove_all(idle: deque[_Ready], remover: _Remover) -> None:
    while idle:
        remover.submit(idle.popleft()[0].close)


class Pool:
    def __init__(self, repo: Repo, envs: Environments, verifier: Verifier, jobs: int,
                 more: Sequence[Environments] = (), ahead: bool | None = None,
                 reuse: bool = True, report: Reporter | None = None) -> None:
        """`more`: the environments of further engines (`--engine` given more than once).
        `reuse`: a used sandbox may take another tree, once wiped (else each gets a new one).
        `report`: where each tree's build and tests send their phase events (None: only the
        heartbeat sees them)."""
        self.report = report
        self.repo = repo
        self.envs = envs
        self.engines = [envs, *more]
        if any(other.git_lock is not envs.git_lock for other in more):
            raise ValueError("the environments of several engines must share one git lock")
        self.backend = envs.backend
        self.verifier = verifier
        self.jobs = max(1, jobs)
        self.ahead = ahead_default() if ahead is None else ahead
        self.reuse = reuse
        self.prepare_with_command = prepare_with_command(self.jobs, self.ahead)
        self.phases = Phases()
        self.spread: dict[str, int] = {}  # trees run per engine (its description)
        self._git = envs.git_lock
        self._stop = threading.Event()
        self._queue: deque[Item] = deque()
        self._taking = threading.Lock()

    def run(self, items: Sequence[Item], finished: Finished, started: Started | None = None,
            tick: Callable[[], None] | None = None) -> dict[str, Outcome]:
        """The outcome of each distinct tree; `finished` is called (in this thread) as each is
        known, cached ones first."""
        results: dict[str, Outcome] = {}
        pending: list[Item] = []
        seen: set[str] = set()
        for item in items:
            if item.tree in seen:
                continue
            seen.add(item.tree)
            cached = self.verifier.lookup(item.tree)
            if cached is not None:
                results[item.tree] = cached
                self.verifier.saw(item.tree, cached)
                finished(item, cached)
            else:
                pending.append(item)
        if pending:
            self._run(pending, results, finished, started, tick)
        return results

    def _run(self, pending: list[Item], results: dict[str, Outcome], finished: Finished,
             started: Started | None, tick: Callable[[], None] | None) -> None:
        self._stop.clear()
        self._queue = deque(pending)
        workers = min(self.jobs, len(pending))
        done: queue.Queue[tuple[Item, Outcome]] = queue.Queue()
        executor = threads.pool(workers, "retcon-verify")
        remover = _Remover(workers)
        futures: list[Future[None]] = [
            executor.submit(self._worker, self.engines[k % len(self.engines)], started, done,
                            remover) for k in range(workers)]
        try:
            waiting = set(futures)
            while waiting or not done.empty():
                finished_workers, waiting = wait(waiting, timeout=TICK,
                                                 return_when=FIRST_COMPLETED)
                for future in finished_workers:
                    future.result()  # a worker's error is raised here
                while not done.empty():
                    item, outcome = done.get()
                    key = self.verifier.key_for(item.tree)  # may read the tree: not under the lock
                    with self._git:
                        self.verifier.record(item.tree, outcome, key)
                    results[item.tree] = outcome
                    self.verifier.saw(item.tree, outcome)
                    finished(item, outcome)
                if tick is not None:
                    tick()
        except BaseException:
            self._stop.set()
            for future in futures:
                future.cancel()
            for envs in self.engines:
                with contextlib.suppress(RetconError):
                    envs.backend.reap()  # the sandboxes still running end now
            raise
        finally:
            executor.shutdown(wait=True)
            remover.shutdown()
        remover.raise_first()  # every result is recorded; a sandbox left behind is still an error

    def _take(self) -> Item | None:
        with self._taking:
            if self._stop.is_set() or not self._queue:
                return None
            return self._queue.popleft()

    def _worker(self, envs: Environments, started: Started | None,
                done: queue.Queue[tuple[Item, Outcome]], remover: _Remover) -> None:
        """Take trees until none is left: run one tree's commands while the next one's sandbox
        is made ready (on a thread of its own), and leave each used sandbox to the next `_open`
        (`idle`) or to `remover`."""
        opener = threads.pool(1, "retcon-open")
        idle: deque[_Ready] = deque()  # used sandboxes, for `_open` to wipe and fill again
        item = self._take()
        upcoming: Future[_Ready] | None = \
            opener.submit(self._open, envs, item, idle, remover) if item is not None else None
        try:
            while item is not None and upcoming is not None:
                waited = time.monotonic()
                try:
                    stack, opened = upcoming.result()
                finally:
                    self.phases.add("waited", time.monotonic() - waited)
                upcoming = None
                if self._stop.is_set():  # opened while the batch was being stopped
                    remover.submit(stack.close)
                    raise _Stopped
                ran = False
                try:
                    following = self._take() if self.ahead else None
                    if following is not None:
                        upcoming = opener.submit(self._open, envs, following, idle, remover)
                    elif self.ahead:  # this worker's last tree: its spare sandbox goes now
                        _remove_all(idle, remover)
                    if started is not None:
                        started(item)
                    at = Where(self.report, item.number, item.name, item.tree)
                    with self.phases.timed("commands"):
                        outcome = run_stages(_constant(opened.box), self.verifier.commands,
                                             at=at)
                    ran = True
                finally:
                    if ran and self.reuse:
                        idle.append((stack, opened))
                    else:
                        remover.submit(stack.close)
                done.put((item, outcome))
                if following is None and not self.ahead:
                    following = self._take()
                    if following is not None:
                        upcoming = opener.submit(self._open, envs, following, idle, remover)
                item = following
        finally:
            if upcoming is not None:  # opened ahead for a batch that stopped
                with contextlib.suppress(BaseException):
                    remover.submit(upcoming.result()[0].close)
            opener.shutdown(wait=True)
            _remove_all(idle, remover)

    def _open(self, envs: Environments, item: Item, idle: deque[_Ready],
              remover: _Remover) -> _Ready:
        """`item`'s sandbox: a used one from `idle`, wiped and filled, when `refill` finds that
        safe (the others are removed); else a fresh one."""
        if self._stop.is_set():
            raise _Stopped
        where = envs.engine_name()
        with self._taking:
            self.spread[where] = self.spread.get(where, 0) + 1
        while idle:
            stack, used = idle.popleft()
            try:
                opened = envs.refill(used, item.tree, item.at, self.phases,
                                     self.prepare_with_command)
            except BaseException:
                remover.submit(stack.close)
                raise
            if opened is not None:
                return stack, opened
            remover.submit(stack.close)
        stack = contextlib.ExitStack()
        with stack:
            opened = stack.enter_context(envs.sandbox(
                item.label, item.tree, item.at, self.phases,
                with_first_command=self.prepare_with_command))
            return stack.pop_all(), opened
