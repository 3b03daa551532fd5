"""Prepared environments: `[sandbox] setup` runs once per set of inputs, and its result is kept
as an image every later sandbox of those inputs starts from, offline.

An environment is keyed by the base image's ID, the setup commands, the git-metadata choice and
version tag, and what setup reads of the files `setup_inputs` matches in the tree being prepared
for (by default the usual manifests and lock files of Python, Node, Rust and Go projects; of
pyproject.toml and Cargo.toml only their dependency tables, see `manifests`), and the whole
content of every tracked file setup names (`setup_files`: the script it runs, a `-r` file, a
makefile, and what those name in turn), so a branch cannot change what setup runs and keep
another tree's key. A setup whose every command reads known files (`pip install NAME`, `-r`
files of names, `cargo fetch` with a lock, `npm ci`: see `setupreads`) is keyed on exactly
those. The `setup` event says why a new environment is made (`why_new`). The
verification cache keys each result on the prepared image's own ID too (`prepared_id`). So each
commit is built and tested in an environment prepared from its own inputs: a commit that adds a
dependency gets a new environment, and a rerun prepares nothing. The image is tagged
`<prefix>/env:<key>`, and labelled with a hash of its repository's scope (LABEL_ENV_SCOPE): a
spec's `image` that is a prepared environment of another scope (or of none) is refused, and so
is a short name the engine would take as an image ID prefix.

What a setup writes is measured before it is kept (`--setup-disk`), and at most
`--keep-environments` environments are kept per repository: the oldest beyond are removed
after a new one is made.

Setup's downloads are kept in a package cache (a volume, `cache_name`) per repository and per
what setup runs, mounted into setup containers only (`--no-package-cache` to go without). It is
held to `--setup-disk` as well: measured after each setup (failed ones too), removed when over it.

Setup is the only step with network: by default (`--setup-network registries`, chosen on the
command line only) it sits on an internal network whose only way out is an egress proxy that
allows the package registries and nothing else (see `sandbox/egress.py`). It runs hardened like
any sandbox, as the commands' uid, on the tree of the commit it prepares for, trusting the host's
CA bundle. A setup that fails is a configuration error (exit 1), never a stuck commit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from retcon_sandbox import progress, threads
from retcon_sandbox.archive import TarStream, spooled
from retcon_sandbox.backends import images, manifests, setupreads
from retcon_sandbox.backends.api import Backend, Sandbox, ToolFailure
from retcon_sandbox.backends.hostaccess import CACHE_PATH, SetupPolicy
from retcon_sandbox.backends.images import (
    ENV_NAME,
    LABEL_CACHE_SCOPE,
    LABEL_ENV_BASE,
    LABEL_ENV_CACHE,
    LABEL_ENV_INPUTS,
    LABEL_ENV_SCOPE,
)
from retcon_sandbox.backends.manifests import Fingerprint, ReadBlob
from retcon_sandbox.errors import ConfigError, ImageError, SandboxError, SetupError
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.report import Reporter
from retcon_sandbox.sourceimports import imports
from retcon_sandbox.spec.settings import BY_KEY, SandboxSettings, human_bytes, shown
from retcon_sandbox.spec.statedir import StateDir

if TYPE_CHECKING:
    from retcon_sandbox.backends.docker.engine import DockerEngine
    from retcon_sandbox.backends.docker.sandboxes import DockerBackend, DockerSandbox

# At any depth (workspaces, monorepos). Requirements and constraints files key it when setup
# reads them: named by a command, by a file setup reads (`-r base.txt`), or by pyproject.toml's
# [tool.setuptools.dynamic]; a docs/requirements.txt that no setup reads does not.
DEFAULT_INPUTS = tuple(f"**/{name}" for name in (
    "pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "Pipfile.lock", "poetry.lock",
    "pdm.lock", "uv.lock",
    "package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml",
    "Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "go.mod", "go.sum",
))
FILE_BYTES = 4096  # the package cache may hold one file per this many bytes of --setup-disk
CA_CANDIDATES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                 "/etc/ssl/cert.pem")
CA_LIMIT = 16 * 1024 * 1024
CACHE_PREFIX = "retcon-sandbox-cache-"
OUTPUT_TAIL = 30


_CERTIFICATE = re.compile(rb"-----BEGIN (TRUSTED )?CERTIFICATE-----[A-Za-z0-9+/=\s]+"
                          rb"-----END \1?CERTIFICATE-----")


def host_ca_bundle() -> tuple[Path, bytes] | None:
    """The certificates of the CA bundle the host trusts: SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
    PIP_CERT, or the system's. Only the certificate blocks are taken: a file that also holds a
    private key (as a proxy's combined PEM can) never has its key copied."""
    named = [os.environ.get(v, "") for v in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT")]
    for candidate in [*filter(None, named), *CA_CANDIDATES]:
        path = Path(candidate)
        with contextlib.suppress(OSError):
            if path.is_file() and path.stat().st_size <= CA_LIMIT:
                certificates = certificate_blocks(path.read_bytes())
                if certificates:
                    return path, certificates
    return None


def certificate_blocks(pem: bytes) -> bytes:
    """The PEM certificate blocks of `pem`, and nothing else."""
    return b"".join(m.group(0) + b"\n" for m in _CERTIFICATE.finditer(pem))


Place = tuple[str, int]  # a commit, and how many commits after it a tree sits (its version)
Version = tuple[str | None, int]  # the tag the workspace's git metadata has, and the distance
WARM_LIMIT = 64 * 1024 * 1024  # the largest tree a pre-warmed sandbox is filled from memory
# How the workspace's git metadata is made, in the verification cache's key: 2, its HEAD holds
# the tree's own entries, in every sandbox (before, a sandbox opened ahead kept the previous
# tree's, and a result kept then is not reused)
GIT_METADATA = 2


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
        self.policy = policy
        self.report = report
        self.source = repo.resolve(runs or source)  # scopes the package cache (`cache_name`)
        self.tag = repo.describe_tag(source) if settings.git_metadata else None
        chosen = settings.setup_inputs
        self._inputs = Patterns(DEFAULT_INPUTS if chosen is None else chosen)  # [] is none
        self._keys: dict[str, str | None] = {}
        self._records: dict[str, dict[str, object]] = {}  # key -> what it is made from
        self._caches: dict[str, str] = {}  # key -> the package cache its setup uses
        self._scope: str | None = None  # see scope()
        self._fresh = fresh
        self._prepared: set[str] = set()  # the keys this run prepared
        self._used: set[str] = set()  # the environments this run opened (never pruned by it)
        self._ids: dict[str, str] = {}  # key -> the image ID this run's sandboxes start from
        # trees are read from git one at a time (verify -j), whatever engine they go to
        self.git_lock = git_lock or threading.Lock()
        self._setup = threading.Lock()  # one setup at a time; a second waiter finds the image
        self._command_seconds = 0.0  # what the current setup's commands took
        self._downloaded: int | None = None  # and received through the egress proxy
        self._closing: list[threading.Thread] = []  # see `_behind`
        self._warned = False
        self._described: dict[str, tuple[str, int] | None] = {}  # commit -> `git describe`
        self._versioned = False  # the git metadata's line was shown

    @property
    def docker(self) -> DockerBackend | None:
        from retcon_sandbox.backends.docker.sandboxes import DockerBackend

        return self.backend if isinstance(self.backend, DockerBackend) else None

    def engine_name(self) -> str:
        """The engine this run's sandboxes go to (as the header names it), or the backend's."""
        docker = self.docker
        return docker.engine.endpoint.describe() if docker is not None else self.backend.name

    # -- keys --------------------------------------------------------------------------------

    def describe(self) -> str:
        """What every environment of this run shares: part of the verification cache's key."""
        git = GIT_METADATA if self.settings.git_metadata else False
        text = json.dumps({"setup": self.settings.setup, "inputs": self._inputs.items,
                           "git": git, "tag": self.tag})
        return f" setup:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def key(self, tree: str) -> str | None:
        """The prepared environment `tree` needs (its image's key), or None without setup."""
        if not self.settings.setup or self.docker is None:
            return None
        if tree not in self._keys:
            with self.git_lock:
                entries = self.repo.ls_tree(tree)
                files, known = keyed_inputs(entries, self.settings, self._link_target,
                                            self._manifest)
            image_id = self.docker.engine.image_id(self.docker.image)
            key = environment_key(image_id, self.settings.setup, self.settings.git_metadata,
                                  self.tag, files, self.scope(), known)
            self._keys[tree] = key
            self._records[key] = input_record(image_id, self.settings.setup,
                                              self.settings.git_metadata, self.tag, files,
                                              known)
            if self.policy.package_cache:
                with self.git_lock:
                    self._caches[key] = cache_name(self.scope(), self.source,
                                                   self.settings.setup, entries,
                                                   self._link_target, self._manifest)
        return self._keys[tree]

    def _link_target(self, entry: TreeEntry) -> str:
        data = self.repo.small_blob(entry.sha, 4096)
        return data.decode("utf-8", "replace") if data else ""

    def _manifest(self, blob: str) -> bytes | None:
        """A manifest's bytes, read from git into memory only (never checked out)."""
        return self.repo.small_blob(blob, manifests.MANIFEST_LIMIT)

    def prepared_id(self, tree: str) -> str | None:
        """The ID of the image `tree`'s environment is (part of the verification cache's key:
        a setup run again, or a removed image, is another environment): "" without setup, None
        when it is not prepared yet (or not in this run, under --no-cache)."""
        key = self.key(tree)
        docker = self.docker
        if key is None or docker is None:
            return ""
        if key in self._ids:
            return self._ids[key]
        tag = f"{images.prefix()}/{ENV_NAME}:{key}"
        if self._fresh or not docker.engine.has_image(tag):
            return None
        return docker.engine.image_id(tag)

    def scope(self) -> str:
        """A setup runs the repository's code: environments are never shared between
        repositories, by path nor by a random id each repository keeps (so a clone elsewhere,
        or another repository later cloned at the same path, prepares its own)."""
        if self._scope is None:
            self._scope = repository_scope(self.repo)
        return self._scope

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
        docker = self.docker
        if docker is None:
            self._local_warning()
            with clock.timed("create"):
                opening = self.backend.open(label)
                box = opening.__enter__()
            with clock.closing("remove", opening):
                files = self._load(box, tree, tar, clock)
                yield Opened(box, files, None)
            return
        with clock.timed("create"):
            opening_docker = docker.open(label, image)
            dbox = opening_docker.__enter__()
        with clock.closing("remove", opening_docker):
            files = self._load(dbox, tree, tar, clock)
            with clock.timed("prepare"):
                self._prepare_workspace(dbox, tree, version, with_first_command)
            yield Opened(dbox, files, image)

    def refill(self, used: Opened, tree: str, at: Place | None = None,
               phases: Phases | None = None, with_first_command: bool = False
               ) -> Opened | None:
        """`used`, a sandbox whose commands are done, holding `tree` instead (as `sandbox`
        would open it) when that is safe: a Docker sandbox of the same environment, which its
        wipe leaves as it started (the helper's `reset`, after `DockerSandbox.wipe` when that
        is needed: no process, file, socket or IPC object of the last tree's is left, so
        nothing of it can reach this tree's verdict). None when it is not: remove it and open a
        fresh one. `with_first_command`: as for `sandbox`."""
        if self.docker is None:
            return None
        from retcon_sandbox.backends.docker.sandboxes import DockerSandbox

        box = used.box
        if not isinstance(box, DockerSandbox):
            return None
        clock = phases if phases is not None else Phases()
        version = self.version(at)
        with clock.timed("environment"):
            if self.image_for(tree, version) != used.environment:
                return None
        with clock.timed("wipe"):
            try:  # the helper alone is enough when the commands left nothing that only their
                left = box.reset()  # uid may remove (each command's exec killed its processes)
                if left:
                    clock.count("wipe_exec")
                    left = box.wipe()
            except (SandboxError, ToolFailure) as exc:  # removed, and another one opened
                left = [f"the wipe failed: {exc}"]
        if left:
            self.report.emit("sandbox_not_reused", left=left[:5])
            return None
        clock.count("reused")
        files = self._load(box, tree, None, clock)
        with clock.timed("prepare"):
            self._prepare_workspace(box, tree, version, with_first_command)
        return Opened(box, files, used.environment)

    def retree(self, box: Sandbox, tree: str, at: Place | None = None) -> None:
        """`box`, whose files were changed in place since it was opened (a `paths` commit's
        files put in a sandbox opened ahead, a model's edits), made to hold what one opened on
        `tree` holds: its git metadata made again for `tree`, and what a setup left copied in
        again where the tree does not have it, in the exec of its next command (no exec of its
        own). Without the Docker backend, there is neither."""
        from retcon_sandbox.backends.docker.sandboxes import DockerSandbox

        if isinstance(box, DockerSandbox) and self.docker is not None:
            self._prepare_workspace(box, tree, self.version(at), with_first_command=True)

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

    def image_for(self, tree: str, version: Version | None = None, prepare: bool = True
                  ) -> str | None:
        key = self.key(tree)
        docker = self.docker
        if key is None or docker is None:
            return None
        repository = f"{images.prefix()}/{ENV_NAME}"
        tag = f"{repository}:{key}"
        with self._setup:
            self._used.add(tag)
            kept = docker.engine.has_image(tag)
            if kept and not (self._fresh and key not in self._prepared):
                self._ids.setdefault(key, docker.engine.image_id(tag))
                return tag
            if not prepare:  # a sandbox opened ahead: the run's own thread prepares it
                raise SetupError(f"the environment {tag} is gone (removed by another run?)",
                                 "It is prepared again when the commit gets there.")
            replaced = docker.engine.image_id(tag) if kept else None
            self._run_setup(docker, tree, repository, key, version or (self.tag, 0),
                            again=kept)
            self._prepared.add(key)
            self._ids[key] = docker.engine.image_id(tag)
            later = contextlib.ExitStack()  # nothing of this run waits for these
            if replaced is not None and replaced != self._ids[key]:
                later.callback(self._remove_replaced, docker.engine, replaced)
            later.callback(self._prune, docker.engine)
            self._behind(later)
        return tag

    @staticmethod
    def _remove_replaced(engine: DockerEngine, image: str) -> None:
        """The image --no-cache replaced (still used by a container: `_prune`, later)."""
        with contextlib.suppress(ImageError):
            engine.remove_image(image)

    def _prune(self, engine: DockerEngine) -> None:
        """Keep the newest `--keep-environments` of this repository's environments (and every
        one this run opened): remove the others."""
        mine = engine.images_labelled(LABEL_ENV_SCOPE, scope_digest(self.scope()))
        mine.sort(key=lambda record: float(record.created or 0), reverse=True)
        for record in mine[self.policy.keep:]:
            if self._used.intersection(record.tags):
                continue
            for tag in record.tags:
                with contextlib.suppress(ImageError):  # in use by another run: next time
                    engine.remove_image(tag)
                    self.report.emit("setup_pruned", tag=tag)
        self._prune_caches(engine)

    def _prune_caches(self, engine: DockerEngine) -> None:
        """Remove this repository's package caches that no kept environment was made with
        (and that this run does not use): they go with their environments."""
        scope = scope_digest(self.scope())
        kept = {r.labels.get(LABEL_ENV_CACHE) for r in engine.images_labelled(LABEL_ENV_SCOPE,
                                                                             scope)}
        for name in engine.volumes_labelled(LABEL_CACHE_SCOPE, scope):
            unused = name not in kept and name not in self._caches.values()
            if unused and engine.remove_volume(name):  # else in use by another run: next time
                self.report.emit("setup_cache_pruned", volume=name)

    def _prepare_workspace(self, box: DockerSandbox, tree: str, version: Version,
                           with_first_command: bool = False) -> None:
        tag, distance = version
        git = self.settings.git_metadata
        if git and tag and not self._versioned:
            self._versioned = True
            self.report.emit("git_metadata", tag=tag, distance=distance)
        listing = b""
        if git:
            with self.git_lock:
                listing = self.repo.tree_index(tree)
        if with_first_command:
            box.prepare_with_next_command(git, tag, distance, self._not_prepared, listing)
            return
        result = box.prepare_workspace(git, tag, distance, listing)
        if not result.passed:
            self._not_prepared(result.exit_code, result.output)

    def _not_prepared(self, code: int, why: str) -> None:
        """A workspace's git metadata could not be made: said once per run."""
        if not self._warned:
            self._warned = True
            self.report.emit("warning", message="the workspace could not be made a git repository "
                             f"(exit {code}): {why.strip()[-300:]}; "
                             "set [sandbox] git_metadata = false if the project needs none")

    def _local_warning(self) -> None:
        """Prepared environments (and the workspace's git metadata) need the Docker backend's
        own operations, outside the `Backend` Protocol: any other backend runs without them."""
        if self.settings.setup and not self._warned:
            self._warned = True
            name = self.backend.name
            used = "the host's own environment is used" if name == "local" else \
                "its sandboxes start from the image as it is"
            self.report.emit("warning", message=f"--sandbox {name} does not run [sandbox] "
                             f"setup: {used}")

    # -- setup -------------------------------------------------------------------------------

    def _run_setup(self, docker: DockerBackend, tree: str, repository: str, key: str,
                   version: Version, again: bool) -> None:
        started = time.monotonic()
        self._command_seconds = 0.0  # the setup's own commands: the rest is ours
        self._downloaded = None  # bytes through the egress proxy, when it is used
        commands = self.settings.setup
        ca = host_ca_bundle()
        record = self._records.get(key, {})
        cache = self._caches.get(key)
        self.report.emit("setup", image=docker.image, key=key, network=self.policy.network,
                         commands=len(commands), ca=str(ca[0]) if ca else None,
                         reason=self._why(docker.engine, record, again), cache=cache)
        after = contextlib.ExitStack()  # the setup's containers and networks, then the cache
        try:
            with progress.phase(self.report, "setup"):
                if cache is not None:  # measured after a setup that failed too: it may be full
                    docker.ensure_cache(cache, {LABEL_CACHE_SCOPE: scope_digest(self.scope())})
                    after.callback(self._keep_cache_within_disk, docker, cache)
                image_id = self._setup_in_container(docker, tree, version, ca, cache, record,
                                                    after)
        except BaseException:
            after.close()
            raise
        self._behind(after)
        self._keep_within_disk(docker, image_id, repository, key)
        self.report.emit("setup_ready", tag=f"{repository}:{key}",
                         seconds=round(time.monotonic() - started, 1),
                         commands=round(self._command_seconds, 1),
                         downloaded=self._downloaded)

    def _behind(self, closing: contextlib.ExitStack) -> None:
        """Close `closing` in a thread of its own (sandbox I/O only): once a setup is committed,
        nothing waits for its container, proxy and networks to go (seconds, on some storage
        drivers), nor for the package cache's measure. `settle` waits for them."""
        def close() -> None:
            try:
                closing.close()
            except Exception as exc:  # said, never lost: removal is retried by `clean`
                self.report.emit("warning", message=f"after a setup: {exc}")

        self._closing.append(threads.start(close, "retcon-setup-done"))

    def settle(self) -> None:
        """Wait for what setups left to close (`_behind`): before the run ends."""
        for thread in self._closing:
            thread.join()
        self._closing.clear()

    def _setup_in_container(self, docker: DockerBackend, tree: str, version: Version,
                            ca: tuple[Path, bytes] | None, cache: str | None,
                            record: dict[str, object], after: contextlib.ExitStack) -> str:
        """The setup's commands in a setup container, committed as an untagged image: its ID.
        They share `setup_timeout`, from the first one's start; the container (and its egress
        proxy) end themselves SETUP_MARGIN_S after it, should the run hang. `after` closes
        the container."""
        commands = self.settings.setup
        box = after.enter_context(docker.open_setup(
            "setup", self.policy.network, self.policy.registries, ca[1] if ca else None, cache,
            lifetime=self.settings.setup_timeout + SETUP_MARGIN_S,
            allowed=self.policy.allowed_addresses))
        with self.git_lock:
            box.load_tree(self.repo.tree_tar(tree, self.settings.max_file_size), record=True)
        self._prepare_workspace(box, tree, version)
        before = box.owned_files(self.settings.timeout)
        cargo = cache is not None and "CARGO_HOME" in {**docker.engine.image_env(docker.image),
                                                       **docker.env}
        deadline = time.monotonic() + self.settings.setup_timeout
        if cargo:  # an exec each way, when a CARGO_HOME (in the image) keeps the crates
            self._cargo(box, CARGO_FROM_CACHE, "copying cached crates in", deadline)
        for command in commands:
            self._setup_command(docker, box, command, deadline)
        if cargo:
            self._cargo(box, CARGO_TO_CACHE, "keeping the crates downloaded", deadline)
        self._downloaded = downloaded(docker.proxy_log())
        kept = box.snapshot()
        if not kept.passed:
            raise SetupError("setup passed, but what it made in the workspace could not be "
                             f"kept: {kept.output.strip()[-500:]}",
                             "The image needs a writable /var/tmp.")
        self._within_files(docker, box, before)
        return docker.commit_image(box, {
            LABEL_ENV_BASE: docker.image, LABEL_ENV_SCOPE: scope_digest(self.scope()),
            "retcon-sandbox.env.setup": json.dumps(commands)[:4000],
            LABEL_ENV_INPUTS: record_label(record), LABEL_ENV_CACHE: cache or ""})

    def _within_files(self, docker: DockerBackend, box: DockerSandbox, before: int | None
                      ) -> None:
        """Setup's files are held to --setup-disk before anything is kept, one per FILE_BYTES
        of it, as the package cache's are: empty files take no bytes, but inodes. Setup runs
        as the commands' uid without capabilities, so what it makes is theirs: the files of
        theirs after it, less those `before` it (counted in the container: the engine's own
        list of changes walks the whole image on some storage drivers, 15 s for a venv on
        fuse-overlayfs). A file it rewrites or removes there is not counted: at most as many
        as the image held before, which is small beside the cap. When a count fails (a
        folder of theirs they cannot read), the engine's list is asked."""
        after = box.owned_files(self.settings.timeout) if before is not None else None
        files = after - before if after is not None and before is not None else \
            docker.files_written(box)
        most = self.policy.disk // FILE_BYTES
        if files > most:
            raise SetupError(f"setup wrote {files} files, over the {most} that --setup-disk "
                             f"{human_bytes(self.policy.disk)} allows: the environment was not "
                             "kept",
                             "If the project needs that many, give a larger --setup-disk SIZE; "
                             "else make [sandbox] setup write fewer files.")

    def _cargo(self, box: DockerSandbox, script: str, what: str, deadline: float) -> None:
        """Cargo keeps its downloads in $CARGO_HOME, which the image must hold for offline
        builds: they are copied between it and the cache (a failure only costs downloads)."""
        result = box.run(script, max(deadline - time.monotonic(), 1.0))
        if not result.passed:
            self.report.emit("warning", message=f"package cache: {what} failed "
                             f"({result.verdict()}): {result.output.strip()[-300:]}")

    def _why(self, engine: DockerEngine, record: dict[str, object], again: bool) -> str:
        """Why this environment is made: against the newest one of this repository."""
        if again:
            return why_new(None, record, fresh=True)
        mine = engine.images_labelled(LABEL_ENV_SCOPE, scope_digest(self.scope()))
        if not mine:
            return why_new(None, record)
        newest = max(mine, key=lambda r: float(r.created or 0))
        previous: dict[str, object] = {}
        with contextlib.suppress(ValueError, TypeError):
            loaded = json.loads(newest.labels.get(LABEL_ENV_INPUTS, ""))
            previous = loaded if isinstance(loaded, dict) else {}
        return why_new(previous, record)

    def _keep_within_disk(self, docker: DockerBackend, image_id: str, repository: str,
                          tag: str) -> None:
        """Tag the committed setup as `repository:tag` if what it wrote (its image's own layer:
        the workspace files the snapshot kept are in it too) is within --setup-disk; above it,
        the untagged image is removed and nothing is kept. Measuring the image, not the
        container, spares a walk of the whole file system; a setup over the cap holds its
        bytes twice until then."""
        try:
            written = docker.written(image_id)
            self.report.emit("setup_disk", written=written, cap=self.policy.disk)
            if written > self.policy.disk:
                raise SetupError(f"setup wrote {human_bytes(written)} ({written} bytes), over "
                                 f"--setup-disk {human_bytes(self.policy.disk)}: the "
                                 "environment was not kept",
                                 "If the project needs that much, give a larger --setup-disk "
                                 "SIZE (e.g. --setup-disk 8g); else make [sandbox] setup write "
                                 "less (clean caches, skip build artefacts).")
            docker.keep_image(image_id, repository, tag)
        except BaseException:
            with contextlib.suppress(ImageError):
                docker.engine.remove_image(image_id)
            raise

    def _keep_cache_within_disk(self, docker: DockerBackend, cache: str) -> None:
        """The package cache is held to --setup-disk too, in bytes and in files (one per
        FILE_BYTES of it: empty files use no blocks, but inodes), measured once the setup's
        container is gone (nothing writes to it then). Over either cap, or when it cannot be
        measured, it is removed: it holds only downloads, which the next setup fetches again."""
        found = docker.cache_usage(cache)
        used, files = found if found is not None else (None, None)
        cap, most = self.policy.disk, self.policy.disk // FILE_BYTES
        self.report.emit("setup_cache_disk", volume=cache, used=used, files=files, cap=cap)
        if used is None or files is None:
            what = "could not be measured"
        elif used > cap:
            what = f"holds {human_bytes(used)}, over --setup-disk {human_bytes(cap)}"
        elif files > most:
            what = f"holds {files} files, over the {most} that --setup-disk allows"
        else:
            return
        try:
            removed = docker.engine.remove_volume(cache)
        except SandboxError as exc:  # a warning: it must not hide why a failed setup failed
            done = f"it could not be removed ({exc.message}): remove it with `docker volume rm`"
        else:
            done = "it was removed (the next setup downloads again)" if removed else \
                "another run uses it: it stays until a setup finds it within the cap"
        self.report.emit("warning", message=f"the package cache {cache} {what}: {done}")

    def _setup_command(self, docker: DockerBackend, box: DockerSandbox, command: str,
                       deadline: float) -> None:
        """One of setup's commands, within what is left of `setup_timeout`."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._timed_out(command, ran=False)
        self.report.emit("setup_command", command=command)
        shown = command if len(command) <= 60 else command[:59] + "…"
        with progress.phase(None, "setup", what=f"setup `{shown}`") as step:
            def said(line: str) -> None:
                step.touch()
                self.report.emit("setup_output", line=line)

            lines = _LineSplitter(said)
            result = box.run(command, left, lines.feed)
            lines.flush()
        self._command_seconds += result.seconds
        if result.passed:
            return
        if result.timed_out:
            raise self._timed_out(command, ran=True)
        tail = "\n".join(result.output.rstrip().splitlines()[-OUTPUT_TAIL:])
        refused = [line for line in docker.proxy_log().splitlines()
                   if line.startswith("refused")]
        hint = ("Fix [sandbox] setup (or the files it reads), then rerun: the environment is "
                "prepared again.")
        if refused:
            hint += ("\nThe egress proxy refused:\n" + "\n".join(f"  {r}" for r in refused[-5:])
                     + "\nSetup reaches the package registries only: add a host with "
                     "--setup-registry HOST, or give --setup-network full.")
        elif self.policy.network == "none":
            hint += " Setup ran with --setup-network none: it had no network."
        raise SetupError(f"setup command failed ({result.verdict()}): {command}\n{tail}", hint)

    def _timed_out(self, command: str, ran: bool) -> SetupError:
        """Setup ran out of its own time: say whose setting that is, and how to give more."""
        limit = shown("setup_timeout", self.settings.setup_timeout)
        default = shown("setup_timeout", BY_KEY["setup_timeout"].default)
        what = f"{command} was still running when" if ran else f"{command} could not start:"
        return SetupError(
            f"setup timed out: {what} its {limit} s were over (setup_timeout: all of "
            "[sandbox] setup's commands together)",
            f"If the setup needs longer, give --setup-timeout S (a spec's [sandbox] "
            f"setup_timeout can only lower the default, {default} s); else make it faster. "
            "The environment is prepared again on the next run.")


SETUP_MARGIN_S = 1800.0  # past setup_timeout: the tree's load, the snapshot, the image's commit


_CLOSED = re.compile(r"closed \S+ up [0-9]+ down ([0-9]+)")


def downloaded(log: str) -> int | None:
    """The bytes a setup received through its egress proxy (the proxy's `closed` lines); None
    without a proxy (--setup-network full or none)."""
    found = [int(m.group(1)) for m in _CLOSED.finditer(log)]
    return sum(found) if log else None


_C = CACHE_PATH + "/cargo/registry"
CARGO_FROM_CACHE = (f'if [ -n "${{CARGO_HOME:-}}" ] && [ -d {_C} ]; then '
                    f'mkdir -p "$CARGO_HOME/registry" && cp -R {_C}/. "$CARGO_HOME/registry/"; fi')
CARGO_TO_CACHE = (f'if [ -n "${{CARGO_HOME:-}}" ] && [ -d "$CARGO_HOME/registry" ]; then '
                  f'mkdir -p {_C} && for d in cache index; do '
                  f'if [ -d "$CARGO_HOME/registry/$d" ]; then cp -R "$CARGO_HOME/registry/$d" '
                  f'{_C}/; fi; done; fi')
# Named files that setup reads as data, not runs: they key its environment, not its cache.
DATA_SUFFIXES = (".txt", ".in", ".toml", ".lock", ".json", ".yaml", ".yml", ".cfg", ".sum",
                 ".mod")
DATA_NAMES = ("Pipfile",)


def cache_name(scope: str, source: str, setup: tuple[str, ...], entries: dict[str, TreeEntry],
               link: LinkTarget | None = None, read: ReadBlob | None = None) -> str:
    """The package cache (a volume) a setup uses: one per repository, per `source` (the branch
    whose commits run: a spec's source, or the tip of the range verified) and per what setup
    runs, its commands and the content of the files they name that are not data (scripts,
    makefiles, a vendored package's code). Code a setup runs without naming it (a setup.py,
    build.rs) can write into the cache, so a cache is shared only by one branch's commits,
    which are one author's code: another branch of the repository never reads it. A commit
    that changes the setup script gets a cache of its own; one that changes only a requirements
    file shares the cache, and downloads what is new."""
    runs = sorted((path, entries[path].mode, entries[path].sha)
                  for path in setup_files(setup, entries, link, read)
                  if not path.endswith(DATA_SUFFIXES)
                  and path.rsplit("/", 1)[-1] not in DATA_NAMES)
    text = json.dumps({"v": 2, "repository": scope, "source": source, "setup": list(setup),
                       "runs": runs})
    return f"{CACHE_PREFIX}{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def repository_scope(repo: Repo) -> str:
    """The repository an environment belongs to: its git directory's path and the random id
    its state directory keeps (see `Environments.scope`)."""
    common = repo.common_dir()
    return f"{common.resolve()} {StateDir(common).scope()}"


def scope_digest(scope: str) -> str:
    """The value of LABEL_ENV_SCOPE: a hash of the scope (its path is not shown)."""
    return hashlib.sha256(b"retcon-sandbox env scope\0" + scope.encode()).hexdigest()[:32]


def normal_reference(name: str) -> str:
    """`name[:tag]` as the engine lists it in RepoTags: Docker Hub's prefixes dropped, the tag
    `latest` when none is given."""
    for hub in ("docker.io/library/", "index.docker.io/library/", "docker.io/",
                "index.docker.io/"):
        if name.startswith(hub):
            name = name[len(hub):]
            break
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def is_environment(tags: tuple[str, ...], labels: dict[str, str]) -> bool:
    """A prepared environment: by its labels (inherited by anything made from it), or by a
    tag under our environments' repository."""
    return (LABEL_ENV_BASE in labels or LABEL_ENV_SCOPE in labels
            or any(t.startswith(f"{images.prefix()}/{ENV_NAME}:") for t in tags))


def check_spec_image(engine: DockerEngine, name: str, scope: str | None) -> None:
    """A spec's `image`, inspected before any sandbox starts from it: it must be one of the
    image's own tags (a short name the engine resolved as an ID prefix is not), and if it is
    a prepared environment, one of this repository's scope."""
    record = engine.image_record(name)
    if normal_reference(name) not in {normal_reference(t) for t in record.tags}:
        raise ImageError(f"[sandbox] image = {name!r} is no tag of an image here: the engine "
                         f"takes it as an image ID prefix ({record.id[:19]})",
                         "A spec names an image by name[:tag] only; an image ID is given on "
                         "the command line (--image ID), by the user.")
    if is_environment(record.tags, record.labels):
        ours = scope is not None and record.labels.get(LABEL_ENV_SCOPE) == scope_digest(scope)
        if not ours:
            raise ImageError(f"[sandbox] image = {name!r} is a prepared environment of another "
                             "repository (or of none): a spec cannot use it",
                             "Name a base image (e.g. retcon-sandbox/base) and let [sandbox] "
                             "setup prepare this repository's own environment.")


LinkTarget = Callable[[TreeEntry], str]  # the text of a tracked symbolic link


def manifest_references(entries: dict[str, TreeEntry], read: ReadBlob | None
                        ) -> tuple[str, ...]:
    """The files an install reads because a manifest says so: what each pyproject.toml's
    [tool.setuptools.dynamic] names (`file = [...]`), and the tracked files each setup.py or
    setup.cfg names (`open("requirements.txt")`, `file: requirements.txt`), from its own
    directory or the root. Files only: a directory a setup.py names (`src`) holds the code,
    whose changes need no new environment."""
    if read is None:
        return ()
    found: list[str] = []
    for path, entry in entries.items():
        name = path.rsplit("/", 1)[-1]
        if entry.mode not in manifests.REGULAR or name not in _DECLARING:
            continue
        data = read(entry.sha)
        if data is None or len(data) > manifests.MANIFEST_LIMIT:
            continue
        directory = path.rpartition("/")[0]
        if name == "pyproject.toml":
            found += filter(None, (_normal(_joined(directory, named))
                                   for named in manifests.dynamic_files(data)))
        elif b"\0" not in data:
            text = data.decode("utf-8", "replace")
            found += sorted(p for p in _named_by(text, ["", directory] if directory else [""])
                            if p in entries and p != path)
    return tuple(found)


_DECLARING = ("pyproject.toml", "setup.py", "setup.cfg")


def inputs(entries: dict[str, TreeEntry], patterns: Patterns, setup: tuple[str, ...] = (),
           link: LinkTarget | None = None, read: ReadBlob | None = None) -> Fingerprint:
    """The files that key the environment, each with its parts (see `manifests`): each match
    of `patterns`, narrowed to what setup reads of it when `read` gives its bytes (the
    dependency tables of pyproject.toml and Cargo.toml), and each tracked file a setup command
    names (`setup_files`), always by its whole content: what setup runs keys it in full."""
    named = setup_files(setup, entries, link, read, manifest_references(entries, read))
    return {path: (manifests.whole(e.mode, e.sha) if path in named
                   else manifests.parts(path, e.mode, e.sha, read))
            for path, e in sorted(entries.items()) if path in named or patterns.matches(path)}


def keyed_inputs(entries: dict[str, TreeEntry], settings: SandboxSettings,
                 link: LinkTarget | None = None, read: ReadBlob | None = None
                 ) -> tuple[Fingerprint, bool]:
    """The files that key a setup's environment, and whether they are exactly what its
    commands read (`setupreads`): then each is keyed by what an installer reads of it (see
    `manifests`), and nothing else is. Otherwise (a command whose reads are not known, or
    `setup_inputs` chosen in the spec) `inputs`: every manifest, and every file setup names."""
    patterns = Patterns(DEFAULT_INPUTS if settings.setup_inputs is None
                        else settings.setup_inputs)
    if settings.setup_inputs is None and read is not None:
        reads = setupreads.known_reads(settings.setup, entries, read)
        if reads is not None:
            return {path: manifests.parts(path, entries[path].mode, entries[path].sha, read)
                    for path in sorted(reads)}, True
    return inputs(entries, patterns, settings.setup, link, read), False


_WORD = re.compile(r"[^\s'\"`;&|()<>=,:]+")  # a word of a shell command, loosely
_QUOTED = re.compile(r"'([^'\n]+)'|\"([^\"\n]+)\"")  # a quoted word may hold spaces
# A tool a setup command runs may run files no word names: a crate's build script, npm's
# lifecycle scripts (`package.json` "postinstall", read for the files they name in turn).
_TOOL_FILES = {"cargo": ("build.rs",)}
_NODE_TOOLS = ("npm", "npx", "yarn", "pnpm")
_LIFECYCLE = ("preinstall", "install", "postinstall", "prepublish", "preprepare", "prepare",
              "postprepare", "dependencies")
_MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
_SCANNED = 64  # named files whose text is read for the files they name in turn
_SCAN_LIMIT = 256 * 1024


def setup_files(setup: tuple[str, ...], entries: dict[str, TreeEntry],
                link: LinkTarget | None = None, read: ReadBlob | None = None,
                also: tuple[str, ...] = ()) -> set[str]:
    """The tracked files that setup commands name, and so may run or read. A word of a command
    (split loosely, so that quoted and nested commands, `-r FILE`, `-rFILE`, `--opt=FILE` and
    `<FILE` count too) names a path from the root or from any directory a `cd` in the command
    names; a named file counts, and so does every file under a named directory (but the root);
    a word with a shell pattern (`cp *.pth`, `req/[a-c]?.txt`) names what it matches in the tree;
    `make` names the makefiles; a tracked symbolic link names its target too. With `read`, the
    text of each named file is read the same way (from the root and from its own directory):
    the script a script sources, the `-r base.txt` of a requirements file. `also`: paths named
    otherwise (a manifest's file references). Naming more than setup reads only prepares an
    environment more often."""
    found: set[str] = set(also)
    for command in setup:
        found.update(_named_by(command, [""]))
        if read is not None and any(w.rsplit("/", 1)[-1] in _NODE_TOOLS
                                    for w in _WORD.findall(command)):
            found.update(_lifecycle_named(entries, read))
    return _followed(found, entries, link, read)


def _lifecycle_named(entries: dict[str, TreeEntry], read: ReadBlob) -> set[str]:
    """What the install scripts of each package.json name (npm runs them on `npm ci`), from
    that file's directory; the scripts' text itself keys the environment with the file."""
    found: set[str] = set()
    for path, entry in entries.items():
        if path.rsplit("/", 1)[-1] != "package.json" or entry.mode not in manifests.REGULAR:
            continue
        data = read(entry.sha)
        try:
            scripts = json.loads(data or b"{}").get("scripts")
        except (ValueError, AttributeError):
            continue
        if not isinstance(scripts, dict):
            continue
        directory = path.rpartition("/")[0]
        for name in _LIFECYCLE:
            if isinstance(scripts.get(name), str):
                found.update(_named_by(scripts[name], [directory]))
    return found


def _named_by(text: str, directories: list[str]) -> set[str]:
    """The paths `text` names from the root or from `directories` (a `cd` adds its own): its
    words and quoted words, `-m` modules and the files of the tools it runs."""
    found: set[str] = set()
    directories = list(directories)
    words = _WORD.findall(text)
    for previous, word in zip(["", *words], words, strict=False):
        candidates = {word, word[2:]} if word.startswith("-") and len(word) > 2 else {word}
        if previous == "-m":
            candidates.update(_module_paths(word))
        for path in filter(None, map(_normal, candidates)):
            if previous == "cd":
                directories.append(path if path != "." else "")
        found.update(_under(directories, candidates))
        tool = word.rsplit("/", 1)[-1]
        if tool in ("make", "gmake"):
            found.update(_joined(d, name) for d in directories for name in _MAKEFILES)
        found.update(_joined(d, name) for d in directories for name in _TOOL_FILES.get(tool, ()))
    quoted = {a or b for a, b in _QUOTED.findall(text)}
    found.update(_under(directories, quoted))
    found.discard(".")
    return found


def _under(directories: list[str], words: set[str]) -> set[str]:
    """Each word as a path from each directory (`..` resolved after joining), if it can be."""
    return {path for word in words if not word.startswith(("/", "~"))
            for d in directories if (path := _normal(_joined(d, word)))}


def _module_paths(name: str) -> set[str]:
    """`a.b` -> `a/b.py` and the package folder `a/b` (every file under it)."""
    if not re.fullmatch(r"[\w.]+", name) or name.startswith("."):
        return set()
    path = name.strip(".").replace(".", "/")
    return {f"{path}.py", path} if path else set()


def _followed(found: set[str], entries: dict[str, TreeEntry], link: LinkTarget | None,
              read: ReadBlob | None) -> set[str]:
    """`found` with the files under named directories, the targets of named links and (with
    `read`) what named files name or import in turn."""
    named: set[str] = set()
    tree: frozenset[str] = frozenset()  # the tree's paths, once a scanned file needs them
    pending = sorted(found)
    scanned = 0
    while pending:  # ends: a path is followed once, and at most _SCANNED files add names
        path = pending.pop()
        entry = entries.get(path)
        if entry is None and _GLOB.search(path):
            pending.extend(sorted(_matching(path, entries) - named))
            continue
        if entry is None:
            prefix = path + "/"
            named.update(p for p in entries if p.startswith(prefix))
            continue
        if path in named:
            continue
        named.add(path)
        directory = path.rpartition("/")[0]
        if entry.mode == "120000" and link is not None:
            target = _normal(_joined(directory, link(entry)))
            if target and target != ".":
                pending.append(target)
        elif read is not None and scanned < _SCANNED and entry.mode in manifests.REGULAR:
            scanned += 1
            data = read(entry.sha)
            if data is not None and len(data) <= _SCAN_LIMIT and b"\0" not in data:
                text = data.decode("utf-8", "replace")
                tree = tree or frozenset(entries)
                runs = _named_by(text, ["", directory] if directory else [""]) | \
                    imports(path, text, tree, script=True)  # what a named script imports
                pending.extend(sorted(runs - named))
    return named


def _matching(pattern: str, entries: dict[str, TreeEntry]) -> set[str]:
    """The tree's files a shell pattern names: those it matches, and every file under a folder
    it matches (a `*` or `?` never crosses a `/`; a hidden name is matched too: more, not less,
    keys the environment)."""
    try:
        regex = re.compile("/".join(_glob_part(part) for part in pattern.split("/")))
    except re.error:  # a class no shell takes either (`[z-a]`): it matches nothing
        return set()
    depth = pattern.count("/") + 1
    return {path for path in entries
            if path.count("/") + 1 >= depth and regex.fullmatch("/".join(
                path.split("/")[:depth]))}


def _glob_part(part: str) -> str:
    """One path component of a shell pattern, as a regular expression."""
    out, i = [], 0
    while i < len(part):
        char = part[i]
        close = part.find("]", i + 2) if char == "[" else -1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif close != -1:
            body = part[i + 1:close]
            negated = body[:1] in ("!", "^")
            body = body[1:] if negated else body
            out.append(("[^/" if negated else "[") + re.sub(r"([\\^\[\]])", r"\\\1", body)
                       + "]")
            i = close
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


_GLOB = re.compile(r"[*?\[]")


def _normal(word: str) -> str | None:
    """A word as a repository-relative path (`./a//b` is `a/b`, `a/../b` is `b`), or None if
    it cannot be one. A shell pattern stays one (`_matching` reads it)."""
    if word.startswith(("/", "~")) or "$" in word:
        return None
    parts: list[str] = []
    for part in word.split("/"):
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts) or "."


def _joined(directory: str, path: str) -> str:
    if not directory:
        return path
    return directory if path == "." else f"{directory}/{path}"


def environment_key(image_id: str, setup: tuple[str, ...], git: bool, tag: str | None,
                    files: Fingerprint, scope: str = "", known: bool = False) -> str:
    """`known`: `files` are exactly what the setup commands read (`keyed_inputs`)."""
    fields = {"v": 2, "image": image_id, "setup": list(setup), "git": git, "tag": tag,
              "inputs": files, "repository": scope, **({"reads": "known"} if known else {})}
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def input_record(image_id: str, setup: tuple[str, ...], git: bool, tag: str | None,
                 files: Fingerprint, known: bool = False) -> dict[str, object]:
    """What an environment was made from, kept in its label (LABEL_ENV_INPUTS) so that the
    next one can say why it is made, and an imported one can be keyed in another clone
    (`envtransfer`). `known`: as for `environment_key`."""
    return {"image": image_id, "setup": list(setup), "git": git, "tag": tag, "inputs": files,
            **({"reads": "known"} if known else {})}


def why_new(previous: dict[str, object] | None, current: dict[str, object],
            fresh: bool = False) -> str:
    """Why an environment is made, against the newest one of the repository (`previous`, the
    record of its label; None when there is none)."""
    if fresh:
        return "--no-cache: prepared again"
    if previous is None:
        return "first environment for this repository"
    if not previous:
        return "the inputs changed (the newest environment kept no record of its own)"
    said = []
    if previous.get("setup") != current["setup"]:
        said.append("setup commands changed")
    if previous.get("image") != current["image"]:
        said.append("the base image changed")
    if previous.get("git") != current["git"] or previous.get("tag") != current["tag"]:
        said.append("the git metadata changed (version tag)")
    old = previous.get("inputs")
    said += manifests.changes(old if isinstance(old, dict) else None,
                              current["inputs"])  # type: ignore[arg-type]
    if not said:
        return ("the environment of these inputs is no longer kept" if isinstance(old, dict)
                else "the inputs changed")
    shown = said[:4] + ([f"and {len(said) - 4} more"] if len(said) > 4 else [])
    return ", ".join(shown)


LABEL_LIMIT = 256 * 1024


def record_label(record: dict[str, object]) -> str:
    """An input record as a label: without the inputs when they would make it too long."""
    text = json.dumps(record, sort_keys=True)
    return text if len(text) <= LABEL_LIMIT else json.dumps({**record, "inputs": None})


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


def unmatched_inputs(patterns: tuple[str, ...] | None, paths: list[str]) -> list[str]:
    """The user's `setup_inputs` patterns that match none of `paths` (the defaults may)."""
    return [] if patterns is None else Patterns(patterns).unmatched(paths)


class _LineSplitter:
    """Output chunks as whole lines (a partial line waits for its end, up to 4 KB)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            self._emit(line.decode("utf-8", "replace").rstrip("\r"))
        if len(self._partial) > 4096:
            self.flush()

    def flush(self) -> None:
        if self._partial:
            self._emit(self._partial.decode("utf-8", "replace"))
            self._partial = b""
