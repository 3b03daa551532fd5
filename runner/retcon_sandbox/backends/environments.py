"""The sandbox supply: each sandbox opened on its tree, from the environment prepared for that
tree (by the backend's `Preparer`, Docker's alone), reused or pre-warmed where that is safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from retcon_sandbox import threads
from retcon_sandbox.archive import TarStream, spooled
from retcon_sandbox.backends.api import Backend, Preparation, Sandbox
from retcon_sandbox.backends.envkeys import (
    DEFAULT_INPUTS,
    GIT_METADATA,
    Place,
    Version,
    unmatched_inputs,
)
from retcon_sandbox.backends.hostaccess import SetupPolicy
from retcon_sandbox.errors import ConfigError
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import Reporter
from retcon_sandbox.spec.settings import SandboxSettings

WARM_LIMIT = 64 * 1024 * 1024  # the largest tree a pre-warmed sandbox is filled from memory


@dataclass(frozen=True)
class Opened:
    box: Sandbox
    files: int
    environment: str | None  # the prepared environment's image, if there is a setup


PHASES = ("environment", "create", "wipe", "git_wait", "git_tar", "load", "prepare",
          "commands", "remove", "waited")


class Phases:
    """Seconds spent in each step of the sandboxes' lives, summed over every thread:
    `environment` (finding or preparing the tree's image), `create` (container created and
    started, helper up), `wipe` (a used sandbox made as new for another tree), `git_wait`
    (waiting for `git_lock`), `git_tar` (the tree read from git under it), `load` (unpacked in
    the sandbox), `prepare` (the workspace's git metadata), `commands` (build and tests),
    `remove`; and `waited`: what a worker spent waiting for its next sandbox to be ready (the
    sandbox overhead on the critical path). `counts` has each phase's number, `reused`: the
    wipes that left a sandbox as new (the others' sandboxes were removed, and fresh ones
    opened), and `wipe_exec`: the wipes that needed an exec as the commands' uid."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.counts: dict[str, int] = dict.fromkeys(PHASES, 0)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self.counts[name] = self.counts.get(name, 0) + 1

    def count(self, name: str) -> None:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - started)

    @contextlib.contextmanager
    def closing(self, name: str, opened: contextlib.AbstractContextManager[object]
                ) -> Iterator[None]:
        """Run the block, then exit `opened` (with the block's exception, if any), timed."""
        try:
            yield
        except BaseException as exc:
            with self.timed(name):
                if not opened.__exit__(type(exc), exc, exc.__traceback__):
                    raise
        else:
            with self.timed(name):
                opened.__exit__(None, None, None)

    def summary(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self.seconds.items()}


class Warming:
    """A sandbox being opened in a thread of its own (`Environments.warm`): `take` waits for
    it; `close` (any number of times) waits for the opening and removes it.

    The waits are on an Event the thread sets when it is done, not on `Thread.join`: a join
    interrupted by a signal (Ctrl-C, SIGTERM) marks a still running thread as stopped (Python
    3.11's handling of bpo-45274), so a later join would return while the thread is still
    creating the container, and the container would be left behind."""

    def __init__(self, envs: Environments, label: str, tree: str, at: Place | None,
                 tar: TarStream) -> None:
        self.tree = tree
        self.preflight = False  # the preflight's sandbox (`ready`), not a pre-warmed one
        self._stack = contextlib.ExitStack()
        self._opened: Opened | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        threads.start(lambda: self._open(envs, label, tree, at, tar), "retcon-warm")

    def _open(self, envs: Environments, label: str, tree: str, at: Place | None,
              tar: TarStream) -> None:
        try:  # the version of `at` is known already (`warm`): no git here
            self._opened = self._stack.enter_context(envs.sandbox(label, tree, at, tar=tar,
                                                                  prepare=False))
        except BaseException as exc:  # raised by `take`, in the caller's thread
            self._error = exc
        finally:
            self._done.set()

    @classmethod
    def ready(cls, tree: str, opened: Opened, stack: contextlib.ExitStack) -> Warming:
        """The preflight's sandbox, opened already (`stack` closes it), to be taken like a
        warmed one."""
        warming = cls.__new__(cls)
        warming.tree, warming._stack, warming._opened = tree, stack, opened
        warming.preflight = True
        warming._error, warming._done = None, threading.Event()
        warming._done.set()
        return warming

    def take(self) -> Opened:
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._opened is not None
        return self._opened

    def close(self) -> None:
        self._done.wait()
        self._stack.close()


class Environments:
    """Opens each sandbox on its tree, from the environment prepared for that tree."""

    def __init__(self, repo: Repo, backend: Backend, settings: SandboxSettings,
                 policy: SetupPolicy, report: Reporter, source: str, fresh: bool = False,
                 git_lock: threading.Lock | None = None, runs: str | None = None) -> None:
        """`source`: the branch whose nearest tag versions the workspace's git metadata.
        `runs`: the commit whose history's code runs (default: `source`'s), whose setups alone
        share a package cache.
        `fresh` (--no-cache): prepare each environment again, once per run, even if kept.
        `git_lock`: shared with the environments of the run's other engines."""
        self.repo = repo
        self.backend = backend
        self.settings = settings
        self.report = report
        runs = repo.resolve(runs or source)  # scopes the package cache (`cache_name`)
        self.tag = repo.describe_tag(source) if settings.git_metadata else None
        chosen = settings.setup_inputs
        self._inputs = Patterns(DEFAULT_INPUTS if chosen is None else chosen)  # [] is none
        # trees are read from git one at a time (verify -j), whatever engine they go to
        self.git_lock = git_lock or threading.Lock()
        self._warned = False
        self._described: dict[str, tuple[str, int] | None] = {}  # commit -> `git describe`
        self.preparer = backend.preparer(Preparation(
            repo, settings, policy, report, runs, self.tag, fresh, self.git_lock))

    def engine_name(self) -> str:
        """The engine this run's sandboxes go to (as the header names it), or the backend's."""
        return self.backend.engine_name()

    # -- keys --------------------------------------------------------------------------------

    def describe(self) -> str:
        """What every environment of this run shares: part of the verification cache's key.
        What keys a setup counts only with a setup: without one, it changes nothing."""
        git = GIT_METADATA if self.settings.git_metadata else False
        inputs = self._inputs.items if self.settings.setup else None
        text = json.dumps({"setup": self.settings.setup, "inputs": inputs,
                           "git": git, "tag": self.tag})
        return f" setup:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def key(self, tree: str) -> str | None:
        """The prepared environment `tree` needs (its image's key), or None without setup."""
        return self.preparer.key(tree) if self.preparer is not None else None

    def prepared_id(self, tree: str) -> str | None:
        """The ID of the image `tree`'s environment is (part of the verification cache's key):
        "" without setup, None when it is not prepared yet."""
        return self.preparer.prepared_id(tree) if self.preparer is not None else ""

    def image_for(self, tree: str, version: Version | None = None, prepare: bool = True
                  ) -> str | None:
        if self.preparer is None:
            return None
        return self.preparer.image_for(tree, version, prepare)

    def settle(self) -> None:
        """Wait for what setups left to close: before the run ends."""
        if self.preparer is not None:
            self.preparer.settle()

    # -- sandboxes ---------------------------------------------------------------------------

    def version(self, at: Place | None) -> Version:
        """The tag and distance of the workspace's git metadata for a tree that sits `at`
        (`git describe --tags --long` of the commit, plus the commits after it): the version a
        checkout would give. Without a place: the source's nearest tag, at distance 0."""
        if at is None or not self.settings.git_metadata:
            return self.tag, 0
        commit, ahead = at
        with self.git_lock:
            if commit not in self._described:
                self._described[commit] = self.repo.describe(commit)
            found = self._described[commit]
        return (found[0], found[1] + ahead) if found else (None, 0)

    @contextlib.contextmanager
    def sandbox(self, label: str, tree: str, at: Place | None = None,
                phases: Phases | None = None, tar: TarStream | None = None,
                prepare: bool = True, with_first_command: bool = False) -> Iterator[Opened]:
        """A fresh sandbox holding `tree`, from the environment prepared for it, with the git
        metadata when on (versioned as the tree's place `at` says, see `version`). `phases`
        adds up the seconds each step takes (the bench reads them). Only the tree's tar is made
        under `git_lock` (into a spool): the sandbox unpacks it outside the lock, while another
        thread reads git. `tar`: the tree, already read from git (see `warm`). Without
        `prepare`, an environment that is not there is an error, not a setup run here.
        `with_first_command`: the git metadata (and what a setup left) are made in the exec of
        the sandbox's first command, not in one of their own (nothing reads its files before:
        `verify`)."""
        clock = phases if phases is not None else Phases()
        version = self.version(at)
        with clock.timed("environment"):
            image = self.image_for(tree, version, prepare)
        preparer = self.preparer
        if preparer is None:
            self._local_warning()
            with clock.timed("create"):
                opening = self.backend.open(label)
                box = opening.__enter__()
            with clock.closing("remove", opening):
                files = self._load(box, tree, tar, clock)
                yield Opened(box, files, None)
            return
        with clock.timed("create"):
            opening = preparer.open(label, image)
            box = opening.__enter__()
        with clock.closing("remove", opening):
            files = self._load(box, tree, tar, clock)
            with clock.timed("prepare"):
                preparer.prepare_workspace(box, tree, version, with_first_command)
            yield Opened(box, files, image)

    def refill(self, used: Opened, tree: str, at: Place | None = None,
               phases: Phases | None = None, with_first_command: bool = False
               ) -> Opened | None:
        """`used`, a sandbox whose commands are done, holding `tree` instead (as `sandbox`
        would open it) when that is safe: a Docker sandbox of the same environment, which its
        wipe leaves as it started (the helper's `reset`, after `DockerSandbox.wipe` when that
        is needed: no process, file, socket or IPC object of the last tree's is left, so
        nothing of it can reach this tree's verdict). None when it is not: remove it and open a
        fresh one. `with_first_command`: as for `sandbox`."""
        preparer = self.preparer
        if preparer is None:
            return None
        box = used.box
        clock = phases if phases is not None else Phases()
        version = self.version(at)
        with clock.timed("environment"):
            if self.image_for(tree, version) != used.environment:
                return None
        with clock.timed("wipe"):
            left = preparer.wipe(box, lambda: clock.count("wipe_exec"))
        if left is None:
            return None
        if left:
            self.report.emit("sandbox_not_reused", left=left[:5])
            return None
        clock.count("reused")
        files = self._load(box, tree, None, clock)
        with clock.timed("prepare"):
            preparer.prepare_workspace(box, tree, version, with_first_command)
        return Opened(box, files, used.environment)

    def retree(self, box: Sandbox, tree: str, at: Place | None = None) -> None:
        """`box`, whose files were changed in place since it was opened (a `paths` commit's
        files put in a sandbox opened ahead, a model's edits), made to hold what one opened on
        `tree` holds: its git metadata made again for `tree`, and what a setup left copied in
        again where the tree does not have it, in the exec of its next command (no exec of its
        own). Without the Docker backend, there is neither."""
        if self.preparer is not None:
            self.preparer.prepare_workspace(box, tree, self.version(at), with_first_command=True)

    def _load(self, box: Sandbox, tree: str, tar: TarStream | None, clock: Phases) -> int:
        if tar is None:
            tar = self.tree_tar(tree, clock)
        with clock.timed("load"):
            return box.load_tree(tar)

    def tree_tar(self, tree: str, clock: Phases) -> TarStream:
        """`tree`'s tar, read from git under `git_lock` and spooled (see `archive.spooled`)."""
        asked = time.monotonic()
        with self.git_lock:
            clock.add("git_wait", time.monotonic() - asked)
            with clock.timed("git_tar"):
                return spooled(self.repo.tree_tar(tree, self.settings.max_file_size))

    def warm(self, label: str, tree: str, at: Place | None = None) -> Warming | None:
        """Begin opening a sandbox for `tree` in a thread of its own, which does sandbox I/O
        only: the tree is read from git here first. None when the environment is not prepared
        yet (a pre-warm never runs a setup: the run may never get there) or the tree is over
        WARM_LIMIT bytes (it is not held in memory: open it when needed)."""
        if self.prepared_id(tree) is None:
            return None
        self.image_for(tree, self.version(at))  # kept: the thread finds it
        with self.git_lock:
            stream = self.repo.tree_tar(tree, self.settings.max_file_size)
            data = bytearray()
            for chunk in stream.chunks:
                data += chunk
                if len(data) > WARM_LIMIT:
                    return None
        return Warming(self, label, tree, at, TarStream((bytes(data),), stream.files))

    def _local_warning(self) -> None:
        """Prepared environments (and the workspace's git metadata) need a `Preparer`, which
        only the Docker backend has: any other backend runs without them."""
        if self.settings.setup and not self._warned:
            self._warned = True
            name = self.backend.name
            used = "the host's own environment is used" if name == "local" else \
                "its sandboxes start from the image as it is"
            self.report.emit("warning", message=f"--sandbox {name} does not run [sandbox] "
                             f"setup: {used}")


def check_inputs(repo: Repo, settings: SandboxSettings, revisions: list[str], names: str
                 ) -> None:
    """Each pattern of the spec's `setup_inputs` must match a file of one of `revisions`
    (`names` says which, for the message): checked before anything is written."""
    chosen = settings.setup_inputs
    if not settings.setup or not chosen:
        return
    paths = sorted({p for rev in revisions for p in repo.ls_tree(rev)})
    unmatched = unmatched_inputs(chosen, paths)
    if unmatched:
        raise ConfigError("[sandbox] → setup_inputs: " + ", ".join(map(repr, unmatched))
                          + f" match(es) no file in {names}",
                          "Check the spelling (patterns use git's glob rules: "
                          "`requirements/*.txt`, `**/Cargo.toml`), or remove the pattern; "
                          "`setup_inputs = []` keys the environment on no file.")
