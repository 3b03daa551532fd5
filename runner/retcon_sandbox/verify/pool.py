"""Building and testing many trees at once, each in a fresh sandbox of its own, N at a time: the
`verify` command and the squash check.

Known results come from the cache first and need no sandbox. Worker threads each open a sandbox,
load their tree and run the commands; git is used by one thread at a time (the tree's tar is made
under a lock, results are recorded by the calling thread). When anything fails (a configuration
error, Ctrl-C), no new sandbox starts, the running ones are removed (`Backend.reap`), and the
error goes on.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from retcon_sandbox.backends.environments import Environments, Place
from retcon_sandbox.errors import RetconError
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.verify.cache import Outcome
from retcon_sandbox.verify.stages import Verifier, run_stages

TICK = 0.25  # seconds between calls of `tick` while waiting (a live display redraws)


@dataclass(frozen=True)
class Item:
    tree: str
    label: str  # the sandbox's label
    at: Place | None = None  # the commit the tree is (its git metadata's version)


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


class Pool:
    def __init__(self, repo: Repo, envs: Environments, verifier: Verifier, jobs: int) -> None:
        self.repo = repo
        self.envs = envs
        self.backend = envs.backend
        self.verifier = verifier
        self.jobs = max(1, jobs)
        self._git = envs.git_lock
        self._stop = threading.Event()

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
                finished(item, cached)
            else:
                pending.append(item)
        if pending:
            self._run(pending, results, finished, started, tick)
        return results

    def _run(self, pending: list[Item], results: dict[str, Outcome], finished: Finished,
             started: Started | None, tick: Callable[[], None] | None) -> None:
        self._stop.clear()
        executor = ThreadPoolExecutor(max_workers=min(self.jobs, len(pending)),
                                      thread_name_prefix="retcon-verify")
        futures: dict[Future[Outcome], Item] = {
            executor.submit(self._work, item, started): item for item in pending}
        try:
            waiting = set(futures)
            while waiting:
                done, waiting = wait(waiting, timeout=TICK, return_when=FIRST_COMPLETED)
                for future in done:
                    item = futures[future]
                    outcome = future.result()  # a worker's error is raised here
                    key = self.verifier.key_for(item.tree)  # may read the tree: not under the lock
                    with self._git:
                        self.verifier.record(item.tree, outcome, key)
                    results[item.tree] = outcome
                    finished(item, outcome)
                if tick is not None:
                    tick()
        except BaseException:
            self._stop.set()
            for future in futures:
                future.cancel()
            with contextlib.suppress(RetconError):
                self.backend.reap()  # the sandboxes still running end now
            raise
        finally:
            executor.shutdown(wait=True)

    def _work(self, item: Item, started: Started | None) -> Outcome:
        if self._stop.is_set():
            raise _Stopped
        if started is not None:
            started(item)
        with self.envs.sandbox(item.label, item.tree, item.at) as opened:
            return run_stages(lambda: opened.box, self.verifier.commands)
