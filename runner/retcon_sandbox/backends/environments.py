"""Prepared environments: `[sandbox] setup` runs once per set of inputs, and its result is kept
as an image every later sandbox of those inputs starts from, offline.

An environment is keyed by the base image's ID, the setup commands, the git-metadata choice and
version tag, and the content of the files `setup_inputs` matches in the tree being prepared for
(by default the usual manifests and lock files of Python, Node, Rust and Go projects), and of
every tracked file a setup command names (`setup_files`: the script it runs, a `-r` file, a
makefile), so a branch cannot change what setup runs and keep another tree's key. The
verification cache keys each result on the prepared image's own ID too (`prepared_id`). So each
commit is built and tested in an environment prepared from its own inputs: a commit that adds a
dependency gets a new environment, and a rerun prepares nothing. The image is tagged
`<prefix>/env:<key>`, and labelled with a hash of its repository's scope (LABEL_ENV_SCOPE): a
spec's `image` that is a prepared environment of another scope (or of none) is refused, and so
is a short name the engine would take as an image ID prefix.

What a setup writes is measured before it is kept (`--setup-disk`), and at most
`--keep-environments` environments are kept per repository: the oldest beyond are removed
after a new one is made.

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

from retcon_sandbox.archive import TarStream
from retcon_sandbox.backends import images
from retcon_sandbox.backends.api import Backend, Sandbox
from retcon_sandbox.backends.hostaccess import SetupPolicy
from retcon_sandbox.backends.images import ENV_NAME, LABEL_ENV_BASE, LABEL_ENV_SCOPE
from retcon_sandbox.errors import ImageError, SetupError
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.report import Reporter
from retcon_sandbox.spec.settings import SandboxSettings, human_bytes
from retcon_sandbox.spec.statedir import StateDir

if TYPE_CHECKING:
    from retcon_sandbox.backends.docker.engine import DockerEngine
    from retcon_sandbox.backends.docker.sandboxes import DockerBackend, DockerSandbox

DEFAULT_INPUTS = tuple(f"**/{name}" for name in (  # at any depth (workspaces, monorepos)
    "pyproject.toml", "setup.py", "setup.cfg", "requirements*.txt", "requirements/*.txt",
    "constraints*.txt", "Pipfile", "Pipfile.lock", "poetry.lock", "pdm.lock", "uv.lock",
    "package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml",
    "Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "go.mod", "go.sum",
))
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


WARM_LIMIT = 64 * 1024 * 1024  # the largest tree a pre-warmed sandbox is filled from memory


@dataclass(frozen=True)
class Opened:
    box: Sandbox
    files: int
    environment: str | None  # the prepared environment's image, if there is a setup


class Warming:
    """A sandbox being opened in a thread of its own (`Environments.warm`): `take` waits for
    it; `close` (any number of times) waits for the opening and removes it."""

    def __init__(self, envs: Environments, label: str, tree: str, tar: TarStream) -> None:
        self.tree = tree
        self._stack = contextlib.ExitStack()
        self._opened: Opened | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, args=(envs, label, tree, tar),
                                        name="retcon-warm", daemon=True)
        self._thread.start()

    def _open(self, envs: Environments, label: str, tree: str, tar: TarStream) -> None:
        try:
            self._opened = self._stack.enter_context(envs.sandbox(label, tree, tar))
        except BaseException as exc:  # raised by `take`, in the caller's thread
            self._error = exc

    def take(self) -> Opened:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._opened is not None
        return self._opened

    def close(self) -> None:
        self._thread.join()
        self._stack.close()


class Environments:
    """Opens each sandbox on its tree, from the environment prepared for that tree."""

    def __init__(self, repo: Repo, backend: Backend, settings: SandboxSettings,
                 policy: SetupPolicy, report: Reporter, source: str, fresh: bool = False
                 ) -> None:
        """`source`: the branch whose nearest tag versions the workspace's git metadata.
        `fresh` (--no-cache): prepare each environment again, once per run, even if kept."""
        self.repo = repo
        self.backend = backend
        self.settings = settings
        self.policy = policy
        self.report = report
        self.tag = repo.describe_tag(source) if settings.git_metadata else None
        self._inputs = Patterns(settings.setup_inputs or DEFAULT_INPUTS)
        self._keys: dict[str, str | None] = {}
        self._scope: str | None = None  # see scope()
        self._fresh = fresh
        self._prepared: set[str] = set()  # the keys this run prepared
        self._used: set[str] = set()  # the environments this run opened (never pruned by it)
        self._ids: dict[str, str] = {}  # key -> the image ID this run's sandboxes start from
        self.git_lock = threading.Lock()  # trees stream from git one at a time (verify -j)
        self._setup = threading.Lock()  # one setup at a time; a second waiter finds the image
        self._warned = False

    @property
    def docker(self) -> DockerBackend | None:
        from retcon_sandbox.backends.docker.sandboxes import DockerBackend

        return self.backend if isinstance(self.backend, DockerBackend) else None

    # -- keys --------------------------------------------------------------------------------

    def describe(self) -> str:
        """What every environment of this run shares: part of the verification cache's key."""
        text = json.dumps({"setup": self.settings.setup, "inputs": self._inputs.items,
                           "git": self.settings.git_metadata, "tag": self.tag})
        return f" setup:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def key(self, tree: str) -> str | None:
        """The prepared environment `tree` needs (its image's key), or None without setup."""
        if not self.settings.setup or self.docker is None:
            return None
        if tree not in self._keys:
            with self.git_lock:
                entries = self.repo.ls_tree(tree)
                files = inputs(entries, self._inputs, self.settings.setup, self._link_target)
            self._keys[tree] = environment_key(
                self.docker.engine.image_id(self.docker.image), self.settings.setup,
                self.settings.git_metadata, self.tag, files, self.scope())
        return self._keys[tree]

    def _link_target(self, entry: TreeEntry) -> str:
        data = self.repo.small_blob(entry.sha, 4096)
        return data.decode("utf-8", "replace") if data else ""

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

    @contextlib.contextmanager
    def sandbox(self, label: str, tree: str, tar: TarStream | None = None) -> Iterator[Opened]:
        """A fresh sandbox holding `tree`, from the environment prepared for it, with the git
        metadata when on. `tar`: the tree, already read from git (see `warm`)."""
        image = self.image_for(tree)
        docker = self.docker
        if docker is None:
            self._local_warning()
            with self.backend.open(label) as box:
                files = self._load(box, tree, tar)
                yield Opened(box, files, None)
            return
        with docker.open(label, image) as dbox:
            files = self._load(dbox, tree, tar)
            self._prepare_workspace(dbox)
            yield Opened(dbox, files, image)

    def _load(self, box: Sandbox, tree: str, tar: TarStream | None) -> int:
        if tar is not None:
            return box.load_tree(tar)
        with self.git_lock:
            return box.load_tree(self.repo.tree_tar(tree, self.settings.max_file_size))

    def warm(self, label: str, tree: str) -> Warming | None:
        """Begin opening a sandbox for `tree` in a thread of its own, which does sandbox I/O
        only: the tree is read from git here first. None when the environment is not prepared
        yet (a pre-warm never runs a setup: the run may never get there) or the tree is over
        WARM_LIMIT bytes (it is not held in memory: open it when needed)."""
        if self.prepared_id(tree) is None:
            return None
        self.image_for(tree)  # kept: the thread finds it
        with self.git_lock:
            stream = self.repo.tree_tar(tree, self.settings.max_file_size)
            data = bytearray()
            for chunk in stream.chunks:
                data += chunk
                if len(data) > WARM_LIMIT:
                    return None
        return Warming(self, label, tree, TarStream((bytes(data),), stream.files))

    def image_for(self, tree: str) -> str | None:
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
            replaced = docker.engine.image_id(tag) if kept else None
            self._run_setup(docker, tree, repository, key)
            self._prepared.add(key)
            self._ids[key] = docker.engine.image_id(tag)
            if replaced is not None and replaced != self._ids[key]:
                with contextlib.suppress(ImageError):  # still used by a container: prune
                    docker.engine.remove_image(replaced)  # the image --no-cache replaced
            self._prune(docker.engine)
        return tag

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

    def _prepare_workspace(self, box: DockerSandbox) -> None:
        result = box.prepare_workspace(self.settings.git_metadata, self.tag)
        if not result.passed and not self._warned:
            self._warned = True
            self.report.emit("warning", message="the workspace could not be made a git repository "
                             f"(exit {result.exit_code}): {result.output.strip()[-300:]}; "
                             "set [sandbox] git_metadata = false if the project needs none")

    def _local_warning(self) -> None:
        if self.settings.setup and not self._warned:
            self._warned = True
            self.report.emit("warning", message="--sandbox local does not run [sandbox] setup: "
                             "the host's own environment is used")

    # -- setup -------------------------------------------------------------------------------

    def _run_setup(self, docker: DockerBackend, tree: str, repository: str, key: str) -> None:
        started = time.monotonic()
        commands = self.settings.setup
        ca = host_ca_bundle()
        self.report.emit("setup", image=docker.image, key=key, network=self.policy.network,
                         commands=len(commands), ca=str(ca[0]) if ca else None)
        with docker.open_setup("setup", self.policy.network, self.policy.registries,
                               ca[1] if ca else None) as box:
            with self.git_lock:
                box.load_tree(self.repo.tree_tar(tree, self.settings.max_file_size), record=True)
            self._prepare_workspace(box)
            for command in commands:
                self._setup_command(docker, box, command)
            kept = box.snapshot()
            if not kept.passed:
                raise SetupError("setup passed, but what it made in the workspace could not be "
                                 f"kept: {kept.output.strip()[-500:]}",
                                 "The image needs a writable /var/tmp.")
            self._check_disk(docker, box)
            docker.commit_image(box, repository, key, {
                LABEL_ENV_BASE: docker.image, LABEL_ENV_SCOPE: scope_digest(self.scope()),
                "retcon-sandbox.env.setup": json.dumps(commands)[:4000]})
        self.report.emit("setup_ready", tag=f"{repository}:{key}",
                         seconds=round(time.monotonic() - started, 1))

    def _check_disk(self, docker: DockerBackend, box: DockerSandbox) -> None:
        """What setup wrote to the image's layer (the workspace files it made are kept there
        too, by the snapshot), against --setup-disk: above it, nothing is kept."""
        written = docker.engine.container_written(box.container_id)
        self.report.emit("setup_disk", written=written, cap=self.policy.disk)
        if written > self.policy.disk:
            raise SetupError(f"setup wrote {human_bytes(written)} ({written} bytes), over "
                             f"--setup-disk {human_bytes(self.policy.disk)}: the environment "
                             "was not kept",
                             "If the project needs that much, give a larger --setup-disk SIZE "
                             "(e.g. --setup-disk 8g); else make [sandbox] setup write less "
                             "(clean caches, skip build artefacts).")

    def _setup_command(self, docker: DockerBackend, box: DockerSandbox, command: str) -> None:
        self.report.emit("setup_command", command=command)
        lines = _LineSplitter(lambda line: self.report.emit("setup_output", line=line))
        result = box.run(command, self.settings.timeout, lines.feed)
        lines.flush()
        if result.passed:
            return
        tail = "\n".join(result.output.rstrip().splitlines()[-OUTPUT_TAIL:])
        refused = [line for line in docker.proxy_log().splitlines()
                   if line.startswith("refused")]
        hint = ("Fix [sandbox] setup (or the files it reads), then rerun: nothing was "
                "recorded, and the environment is prepared again.")
        if refused:
            hint += ("\nThe egress proxy refused:\n" + "\n".join(f"  {r}" for r in refused[-5:])
                     + "\nSetup reaches the package registries only: add a host with "
                     "--setup-registry HOST, or give --setup-network full.")
        elif self.policy.network == "none":
            hint += " Setup ran with --setup-network none: it had no network."
        raise SetupError(f"setup command failed ({result.verdict()}): {command}\n{tail}", hint)


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


def inputs(entries: dict[str, TreeEntry], patterns: Patterns, setup: tuple[str, ...] = (),
           link: LinkTarget | None = None) -> list[tuple[str, str, str]]:
    """The files that key the environment: (path, mode, blob) of each match of `patterns`, and
    of each tracked file a setup command names (`setup_files`), sorted."""
    named = setup_files(setup, entries, link)
    return sorted((path, e.mode, e.sha) for path, e in entries.items()
                  if path in named or patterns.matches(path))


_WORD = re.compile(r"[^\s'\"`;&|()<>=,:]+")  # a word of a shell command, loosely
_MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
_SYMLINK_HOPS = 8


def setup_files(setup: tuple[str, ...], entries: dict[str, TreeEntry],
                link: LinkTarget | None = None) -> set[str]:
    """The tracked files that setup commands name, and so may run. A word of a command (split
    loosely, so that quoted and nested commands, `-r FILE`, `-rFILE`, `--opt=FILE` and `<FILE`
    count too) names a path from the root or from any directory a `cd` in the command names;
    a named file counts, and so does every file under a named directory (but the root); `make`
    names the makefiles; a tracked symbolic link names its target too. Naming more than setup
    runs only prepares an environment more often."""
    found: set[str] = set()
    for command in setup:
        directories = [""]
        words = _WORD.findall(command)
        for previous, word in zip(["", *words], words, strict=False):
            candidates = {word, word[2:]} if word.startswith("-") and len(word) > 2 else {word}
            for path in filter(None, map(_normal, candidates)):
                if previous == "cd":
                    directories.append(path if path != "." else "")
                found.update(_joined(directory, path) for directory in directories)
            if word.rsplit("/", 1)[-1] in ("make", "gmake"):
                found.update(_joined(d, name) for d in directories for name in _MAKEFILES)
    found.discard(".")
    named: set[str] = set()
    pending = sorted(found)
    hops = 0
    while pending and hops <= _SYMLINK_HOPS * max(1, len(found)):
        hops += 1
        path = pending.pop()
        entry = entries.get(path)
        if entry is None:
            prefix = path + "/"
            named.update(p for p in entries if p.startswith(prefix))
            continue
        if path in named:
            continue
        named.add(path)
        if entry.mode == "120000" and link is not None:
            target = _normal(_joined(path.rpartition("/")[0], link(entry)))
            if target and target != ".":
                pending.append(target)
    return named


def _normal(word: str) -> str | None:
    """A word as a repository-relative path (`./a//b` is `a/b`, `a/../b` is `b`), or None if
    it cannot be one."""
    if word.startswith(("/", "~")) or "$" in word or "*" in word:
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
                    files: list[tuple[str, str, str]], scope: str = "") -> str:
    text = json.dumps({"v": 1, "image": image_id, "setup": list(setup), "git": git, "tag": tag,
                       "inputs": files, "repository": scope})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
