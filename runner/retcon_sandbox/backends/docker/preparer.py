"""Prepared environments, made in Docker: `[sandbox] setup` runs once per key (`envkeys`),
and its result is kept as an image, `<prefix>/env:<key>`, that later sandboxes start from.

- The image is labelled with its repository's scope (LABEL_ENV_SCOPE): a spec's `image` that
  is another scope's environment, or a short name taken as an image ID prefix, is refused.
- What setup writes is held to `--setup-disk`; at most `--keep-environments` are kept.
- Downloads go to a package cache (a volume, `cache_name`) per repository and per what setup
  runs, held to `--setup-disk` too (`--no-package-cache` to go without).
- Setup is the only step with network: by default an internal network whose one way out is
  an egress proxy to the package registries (`sandbox/egress.py`). It runs hardened, as the
  commands' uid, trusting the host's CA bundle. A failed setup is a configuration error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from retcon_sandbox import progress, threads
from retcon_sandbox.backends import manifests
from retcon_sandbox.backends.api import Preparation, Sandbox, ToolFailure
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.docker.sandboxes import DockerSandbox, DockerSandboxes
from retcon_sandbox.backends.docker.sandboximages import (
    ENV_NAME,
    LABEL_CACHE_SCOPE,
    LABEL_ENV_BASE,
    LABEL_ENV_CACHE,
    LABEL_ENV_INPUTS,
    LABEL_ENV_SCOPE,
)
from retcon_sandbox.backends.envkeys import (
    Version,
    cache_name,
    environment_key,
    input_record,
    keyed_inputs,
    record_label,
    scope_digest,
    why_new,
)
from retcon_sandbox.backends.hostaccess import CACHE_PATH
from retcon_sandbox.errors import ImageError, SandboxError, SetupError
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.spec.settings import BY_KEY, human_bytes, shown
from retcon_sandbox.spec.statedir import StateDir

FILE_BYTES = 4096  # the package cache may hold one file per this many bytes of --setup-disk
CA_CANDIDATES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                 "/etc/ssl/cert.pem")
CA_LIMIT = 16 * 1024 * 1024
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



class DockerPreparer:
    """Finds or prepares the environment each tree needs, and makes a Docker sandbox's
    workspace a git repository. One per backend of a run (`DockerSandboxes.preparer`)."""

    def __init__(self, job: Preparation, backend: DockerSandboxes) -> None:
        self.repo = job.repo
        self.backend = backend
        self.settings = job.settings
        self.policy = job.policy
        self.report = job.report
        self.source = job.source
        self.tag = job.tag
        self.git_lock = job.git_lock
        self._fresh = job.fresh
        self._keys: dict[str, str | None] = {}
        self._records: dict[str, dict[str, object]] = {}  # key -> what it is made from
        self._caches: dict[str, str] = {}  # key -> the package cache its setup uses
        self._scope: str | None = None  # see scope()
        self._prepared: set[str] = set()  # the keys this run prepared
        self._used: set[str] = set()  # the environments this run opened (never pruned by it)
        self._ids: dict[str, str] = {}  # key -> the image ID this run's sandboxes start from
        self._setup = threading.Lock()  # one setup at a time; a second waiter finds the image
        self._command_seconds = 0.0  # what the current setup's commands took
        self._downloaded: int | None = None  # and received through the egress proxy
        self._image_seconds = 0.0  # and what the engine took to keep it as an image
        self._closing: list[threading.Thread] = []  # see `_behind`
        self._warned = False
        self._versioned = False  # the git metadata's line was shown

    def engine_name(self) -> str:
        return self.backend.engine.endpoint.describe()

    def key(self, tree: str) -> str | None:
        """The prepared environment `tree` needs (its image's key), or None without setup."""
        if not self.settings.setup:
            return None
        if tree not in self._keys:
            with self.git_lock:
                entries = self.repo.ls_tree(tree)
                files, known = keyed_inputs(entries, self.settings, self._link_target,
                                            self._manifest)
            image_id = self.backend.engine.image_id(self.backend.image)
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
        docker = self.backend
        if key is None:
            return ""
        if key in self._ids:
            return self._ids[key]
        tag = f"{sandboximages.prefix()}/{ENV_NAME}:{key}"
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

    def open(self, label: str, image: str | None) -> contextlib.AbstractContextManager[Sandbox]:
        return self.backend.open(label, image)

    def wipe(self, box: Sandbox, exec_used: Callable[[], None]) -> list[str] | None:
        """What of its last tree `box` still holds once wiped (the helper's `reset`, then
        `DockerSandbox.wipe` when needed, which `exec_used` counts); None when it is no
        sandbox of this backend's, which cannot be reused."""
        if not isinstance(box, DockerSandbox):
            return None
        try:  # the helper alone is enough when the commands left nothing that only their
            left = box.reset()  # uid may remove (each command's exec killed its processes)
            if left:
                exec_used()
                left = box.wipe()
        except (SandboxError, ToolFailure) as exc:  # removed, and another one opened
            left = [f"the wipe failed: {exc}"]
        return left

    def image_for(self, tree: str, version: Version | None = None, prepare: bool = True
                  ) -> str | None:
        key = self.key(tree)
        docker = self.backend
        if key is None:
            return None
        repository = f"{sandboximages.prefix()}/{ENV_NAME}"
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

    def prepare_workspace(self, box: Sandbox, tree: str, version: Version,
                          with_first_command: bool = False) -> None:
        """`box`'s workspace made a git repository for `tree` (when on), and what a setup left
        copied in: a Docker sandbox's own operations (any other box is left as it is)."""
        if not isinstance(box, DockerSandbox):
            return
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


    # -- setup -------------------------------------------------------------------------------

    def _run_setup(self, docker: DockerSandboxes, tree: str, repository: str, key: str,
                   version: Version, again: bool) -> None:
        started = time.monotonic()
        self._command_seconds = 0.0  # the setup's own commands: the rest is ours
        self._downloaded = None  # bytes through the egress proxy, when it is used
        self._image_seconds = 0.0
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
                         image=round(self._image_seconds, 1), downloaded=self._downloaded)

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

    def _setup_in_container(self, docker: DockerSandboxes, tree: str, version: Version,
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
        if docker.authority_failed:
            self.report.emit("warning", message="package cache: the egress proxy could not make "
                             "its certificate authority, so pip may download PyPI's files "
                             f"again ({docker.authority_failed})")
        with self.git_lock:
            box.load_tree(self.repo.tree_tar(tree, self.settings.max_file_size), record=True)
        self.prepare_workspace(box, tree, version)
        since = box.clock(self.settings.timeout)
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
        self._within_files(docker, box, since)
        started = time.monotonic()
        image = docker.commit_image(box, {
            LABEL_ENV_BASE: docker.image, LABEL_ENV_SCOPE: scope_digest(self.scope()),
            "retcon-sandbox.env.setup": json.dumps(commands)[:4000],
            LABEL_ENV_INPUTS: record_label(record), LABEL_ENV_CACHE: cache or ""})
        self._image_seconds = time.monotonic() - started  # the whole rootfs, on some drivers
        return image

    def _within_files(self, docker: DockerSandboxes, box: DockerSandbox, since: str | None
                      ) -> None:
        """Setup's files are held to --setup-disk before anything is kept, one per FILE_BYTES
        of it, as the package cache's are: empty files take no bytes, but inodes. Setup runs
        as the commands' uid without capabilities, so what it makes is theirs, with an inode
        changed after `since`, the container's clock before its first command: one walk
        after it, in the container (the engine's own list of changes walks the whole image on
        some storage drivers, 15 s for a venv on fuse-overlayfs; a count before setup too cost
        2 s more there). A file it rewrites counts too. When the count fails (a folder of
        theirs they cannot read, an image without GNU find or date), the engine's list is
        asked."""
        files = box.owned_files(since, self.settings.timeout) if since is not None else None
        if files is None:
            files = docker.files_written(box)
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

    def _keep_within_disk(self, docker: DockerSandboxes, image_id: str, repository: str,
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

    def _keep_cache_within_disk(self, docker: DockerSandboxes, cache: str) -> None:
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

    def _setup_command(self, docker: DockerSandboxes, box: DockerSandbox, command: str,
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


def repository_scope(repo: Repo) -> str:
    """The repository an environment belongs to: its git directory's path and the random id
    its state directory keeps (see `Preparer.scope`)."""
    common = repo.common_dir()
    return f"{common.resolve()} {StateDir(common).scope()}"



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
            or any(t.startswith(f"{sandboximages.prefix()}/{ENV_NAME}:") for t in tags))


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
