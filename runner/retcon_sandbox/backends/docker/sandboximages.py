"""The sandbox images: which exist, how they are tagged, built and bootstrapped offline.

Each image is tagged by the content of its build inputs (its Dockerfile and context files, and
its parent image's tag), e.g. `retcon-sandbox/base:3f9c2a1b7d4e`. A release whose Dockerfiles
changed therefore asks for a tag that does not exist yet and builds it: a stale image is never
reused. Older tags stay until `images prune`.

Where a registry answers, the Dockerfiles build the ordinary way (FROM debian:bookworm-slim).
Where none does, a Debian root filesystem is made with debootstrap from Debian's package mirror,
loaded with `docker import`, and passed to the same Dockerfiles as BASE.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from retcon_sandbox import progress
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.errors import ImageError, log_dir
from retcon_sandbox.resources import dockerfiles

ENV_NAME = "env"  # prepared environments are tagged <prefix>/env:<key>
LABEL_ENV_BASE = "retcon-sandbox.env.base"  # the image a prepared environment was made from
LABEL_ENV_SCOPE = "retcon-sandbox.env.scope"  # a hash of the repository scope it belongs to
LABEL_ENV_INPUTS = "retcon-sandbox.env.inputs"  # what it was made from (to say why the next is)
LABEL_ENV_CACHE = "retcon-sandbox.env.cache"  # the package cache its setup used
LABEL_CACHE_SCOPE = "retcon-sandbox.cache.scope"  # a package cache's repository (a hash)

REPOSITORY = "retcon-sandbox"
REGISTRY_BASE = "debian:bookworm-slim"
ROOTFS_PACKAGES = "python3,python3-pytest,python3-venv,python3-pip,git,gcc,make,libc6-dev,passwd"
ROOTFS_REPO = "retcon-sandbox/debian"
# What debian:bookworm-slim leaves out (debuerreotype's "slim" variant), kept out of a
# bootstrapped root filesystem too, and by dpkg from what the Dockerfiles install on it: the
# two ways of building give the same files (but for the links dpkg still makes in
# /usr/share/doc, which slim() removes too). They were 4,300 of the base image's 19,300 files,
# and on fuse-overlayfs the engine walks every file of an image to commit a prepared
# environment (bench/image_commit.py).
SLIM = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
"""
ROOTFS = f"{ROOTFS_PACKAGES}\0{SLIM}"  # what a bootstrapped root filesystem is made of
_PREFIX = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
LABEL_INPUTS = "retcon-sandbox.inputs"

Progress = Callable[[str], None]
HEARTBEAT_S = 10.0
_beating = threading.local()


class _Lines:
    """A reporter that says each heartbeat as a progress line."""

    def __init__(self, say: Progress) -> None:
        self._say = say

    def emit(self, event: str, **data: Any) -> None:
        if event == "heartbeat" and not data.get("live"):
            self._say(progress.line(data))


@contextlib.contextmanager
def heartbeat(say: Progress, what: str, every: float = HEARTBEAT_S) -> Iterator[Progress]:
    """`say`, plus a line saying how long `what` has taken whenever `every` seconds pass
    without one (a build step that prints nothing for a minute is not a hang): the run's own
    heartbeat (progress.heartbeat) when one is watching, else one of its own. Nested
    heartbeats (a parent image built on the way) leave it to the outermost."""
    if getattr(_beating, "on", False):
        yield say
        return

    _beating.on = True
    try:
        with progress.heartbeat(_Lines(say), every=every), \
                progress.phase(None, "image", what=what) as activity:
            def said(line: str) -> None:
                activity.touch()
                say(line)

            yield said
    finally:
        _beating.on = False


@dataclass(frozen=True)
class ImageDef:
    name: str
    parent: str | None  # another ImageDef's name, or None for the Debian base
    holds: str  # what is in it, for `images list` and docs/security.md

    @property
    def repository(self) -> str:
        return f"{prefix()}/{self.name}"

    @property
    def tag(self) -> str:
        return f"{self.repository}:{inputs_digest(self.name)}"


CATALOG = {
    "base": ImageDef("base", None, "Debian 12, python3 with a venv first on PATH, pytest, git, "
                     "gcc, make"),
    "node": ImageDef("node", "base", "base plus Node.js and npm"),
    "rust": ImageDef("rust", "base", "base plus Rust and cargo (rustc-web, a current release)"),
}


def prefix() -> str:
    """Where our images are tagged: `retcon-sandbox/<name>`, or RETCON_SANDBOX_IMAGE_PREFIX."""
    value = os.environ.get("RETCON_SANDBOX_IMAGE_PREFIX", "").strip() or REPOSITORY
    if not _PREFIX.fullmatch(value):
        raise ImageError(f"RETCON_SANDBOX_IMAGE_PREFIX={value!r} is not a Docker repository name",
                         "Use lowercase letters, digits, `.`, `_`, `-` and `/`.")
    return value


def _files(folder: Traversable, prefix: str = "") -> Iterator[tuple[str, bytes]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = f"{prefix}{entry.name}"
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from _files(entry, name + "/")
        elif entry.is_file():
            yield name, entry.read_bytes()


def context_files(name: str) -> list[tuple[str, bytes]]:
    folder = dockerfiles() / name
    files = list(_files(folder)) if folder.is_dir() else []
    if not any(path == "Dockerfile" for path, _ in files):
        raise ImageError(f"the Dockerfile of image {name!r} is missing from this installation",
                         "Reinstall retcon-sandbox (`pip install --force-reinstall "
                         "retcon-sandbox`).")
    return files


@cache
def inputs_digest(name: str) -> str:
    """12 hex digits over the image's build inputs and its parent's tag."""
    definition = CATALOG[name]
    digest = hashlib.sha256(b"retcon-sandbox image v1\0")
    digest.update((CATALOG[definition.parent].tag if definition.parent else ROOTFS)
                  .encode() + b"\0")
    for path, data in context_files(name):
        digest.update(path.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:12]


def rootfs_tag() -> str:
    return f"{ROOTFS_REPO}:bookworm-{hashlib.sha256(ROOTFS.encode()).hexdigest()[:8]}"


def default_image() -> str:
    return CATALOG["base"].tag


def resolve(name: str) -> str:
    """One of our images named without a tag, or as `:latest`, means its current tag."""
    repository, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
    for definition in CATALOG.values():
        if repository == definition.repository and tag in ("", "latest"):
            return definition.tag
    return name


def by_tag(tag: str) -> ImageDef | None:
    return next((d for d in CATALOG.values() if d.tag == tag), None)


def ensure(engine: DockerEngine, tag: str, progress: Progress, allow_pull: bool = False) -> str:
    """Make `tag` available and return it: present, built from our Dockerfiles (bootstrapping
    if need be) or, only when allowed, pulled."""
    tag = resolve(tag)
    if engine.has_image(tag):
        return tag
    definition = by_tag(tag)
    if definition is not None:
        with building(engine, tag, progress):
            if engine.has_image(tag):  # another process built it while this one waited
                return tag
            progress(f"Image {tag} is not built yet: building it (first use only)...")
            with heartbeat(progress, f"building {tag}") as say:
                return build(engine, definition.name, say)
    if allow_pull and engine.try_pull(tag):
        return tag
    raise ImageError(f"image {tag} is not available" + ("" if allow_pull else
                                                          " (and pulling is not allowed)"),
                     "Build or load it (`docker build`, `docker load`), give --allow-pull to "
                     "let retcon-sandbox pull it, or use ours: "
                     + ", ".join(d.repository for d in CATALOG.values()))


@contextlib.contextmanager
def building(engine: DockerEngine, tag: str, progress: Progress) -> Iterator[None]:
    """One build of `tag` for an engine at a time on this machine (two runs, or two test
    workers, starting at once on a fresh machine): a lock file in the state folder; the second
    waits for the first, then finds the image. Where no lock file can be made, no lock."""
    name = hashlib.sha256(f"{engine.endpoint.host}\0{tag}".encode()).hexdigest()[:16]
    path = log_dir() / "locks" / f"image-{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+b")
    except OSError:  # a symbolic link there, too: never followed
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"Waiting for another process building {tag}...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build(engine: DockerEngine, name: str, progress: Progress) -> str:
    definition = CATALOG.get(name)
    if definition is None:
        raise ImageError(f"no image named {name!r}", "Known: " + ", ".join(CATALOG))
    if definition.parent is None:
        base = debian_base(engine, progress)
    else:
        base = ensure(engine, CATALOG[definition.parent].tag, progress)
    tag = definition.tag
    progress(f"Building {tag} (FROM {base})...")
    engine.build(context_tar(name), tag, {"BASE": base},
                 {LABEL_INPUTS: inputs_digest(name)}, lambda line: progress("  " + line))
    return tag


def context_tar(name: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, data in context_files(name):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o755 if path.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


@dataclass(frozen=True)
class Listed:
    name: str
    tag: str
    state: str  # current | not built | stale


def listing(engine: DockerEngine) -> list[Listed]:
    rows: list[Listed] = []
    present = set(engine.image_tags(f"{prefix()}/"))
    for definition in CATALOG.values():
        current = definition.tag
        rows.append(Listed(definition.name, current,
                           "current" if current in present else "not built"))
        rows += [Listed(definition.name, t, "stale") for t in sorted(present)
                 if t.startswith(definition.repository + ":") and t != current]
    return rows + environments(engine, present)


def environments(engine: DockerEngine, present: set[str]) -> list[Listed]:
    """Prepared environments (`[sandbox] setup`): stale when their base image is gone, or is
    one of ours that is no longer current."""
    rows = []
    current = {d.repository: d.tag for d in CATALOG.values()}
    for tag in sorted(t for t in present if t.startswith(f"{prefix()}/{ENV_NAME}:")):
        base = engine.image_labels(tag).get(LABEL_ENV_BASE, "")
        repository = base.rpartition(":")[0]
        stale = not base or not engine.has_image(base) or current.get(repository, base) != base
        rows.append(Listed(ENV_NAME, tag, f"{'stale ' if stale else ''}prepared environment "
                           f"(from {base or 'an unknown image'})"))
    return rows


def prune(engine: DockerEngine, progress: Progress, environments: bool = False) -> list[str]:
    """Remove our images whose tags are not current (built from older inputs), prepared
    environments whose base is stale, and with `environments`, every prepared environment;
    then every package cache no environment left uses."""
    stale = [row.tag for row in listing(engine) if row.state.startswith("stale")
             or (environments and row.name == ENV_NAME)]
    for tag in reversed(stale):  # prepared environments before the images they came from
        engine.remove_image(tag)
        progress(f"Removed {tag}")
    return stale + prune_caches(engine, progress)


def prune_caches(engine: DockerEngine, progress: Progress) -> list[str]:
    """Remove the package caches (volumes) that no prepared environment left was made with."""
    used = {engine.image_labels(tag).get(LABEL_ENV_CACHE)
            for tag in engine.image_tags(f"{prefix()}/{ENV_NAME}:")}
    removed = []
    for name in sorted(engine.volumes_labelled(LABEL_CACHE_SCOPE)):
        if name not in used and engine.remove_volume(name):
            progress(f"Removed the package cache {name}")
            removed.append(name)
    return removed


def debian_base(engine: DockerEngine, progress: Progress) -> str:
    """debian:bookworm-slim if it is here or a registry gives it; else a bootstrapped rootfs."""
    if engine.has_image(REGISTRY_BASE):
        return REGISTRY_BASE
    rootfs = rootfs_tag()
    if engine.has_image(rootfs):
        return rootfs
    progress(f"Trying to pull {REGISTRY_BASE}...")
    if engine.try_pull(REGISTRY_BASE):
        return REGISTRY_BASE
    progress("No registry answers: bootstrapping a Debian base from packages instead.")
    return bootstrap(engine, progress)


def bootstrap(engine: DockerEngine, progress: Progress) -> str:
    """debootstrap a minimal Debian bookworm with our packages and `docker import` it."""
    debootstrap = _debootstrap(progress)
    mirror = os.environ.get("RETCON_SANDBOX_DEBIAN_MIRROR", DEFAULT_MIRROR)
    work = Path(tempfile.mkdtemp(prefix="retcon-rootfs-", dir="/var/tmp"))
    rootfs = work / "rootfs"
    repository, _, tag = rootfs_tag().partition(":")
    try:
        progress(f"debootstrap --variant=minbase bookworm from {mirror} (about a minute)...")
        _run([debootstrap, "--variant=minbase", f"--include={ROOTFS_PACKAGES}", "bookworm",
              str(rootfs), mirror], progress)
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        slim(rootfs)
        progress(f"docker import → {repository}:{tag}...")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        assert tar.stdout is not None
        engine.import_rootfs(tar.stdout, repository, tag)
        if tar.wait() != 0:
            raise ImageError("packing the root filesystem failed (tar)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"Bootstrapped {repository}:{tag}.")
    return f"{repository}:{tag}"


def slim(rootfs: Path) -> None:
    """Leave out of `rootfs` what SLIM excludes, and have its dpkg keep them out."""
    rules = [line.split(" ", 1) for line in SLIM.splitlines()]
    for verb, pattern in rules:
        if verb == "path-exclude":
            _exclude(rootfs, pattern.removesuffix("/*"),
                     [p for v, p in rules if v == "path-include"])
    config = rootfs / "etc/dpkg/dpkg.cfg.d"
    config.mkdir(parents=True, exist_ok=True)
    (config / "retcon-sandbox-slim").write_text(SLIM)


def _exclude(rootfs: Path, folder: str, keep: list[str]) -> None:
    """Every file below `folder` of `rootfs` but those matching a pattern of `keep`, and the
    folders left empty (`folder` itself stays). Links are removed, never followed."""
    top = rootfs / folder.lstrip("/")
    if not top.resolve().is_relative_to(rootfs.resolve()):
        return  # through a link out of the root filesystem (Debian's packages make none)
    for directory, folders, files in os.walk(top, topdown=False):
        for name in (*files, *(f for f in folders if (Path(directory) / f).is_symlink())):
            path = Path(directory) / name
            if not any(fnmatch.fnmatchcase("/" + str(path.relative_to(rootfs)), k) for k in keep):
                path.unlink()
        if Path(directory) != top and not any(Path(directory).iterdir()):
            Path(directory).rmdir()


def _debootstrap(progress: Progress) -> str:
    found = shutil.which("debootstrap") or ("/usr/sbin/debootstrap"
                                            if Path("/usr/sbin/debootstrap").exists() else None)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        progress("Installing debootstrap (apt-get install debootstrap)...")
        _run(["apt-get", "update", "-qq"], progress)
        _run(["apt-get", "install", "-y", "-qq", "debootstrap"], progress)
        return shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    raise ImageError("no registry answers and debootstrap is not installed",
                     "Install it (`sudo apt-get install debootstrap`) and run "
                     "`sudo retcon-sandbox images bootstrap`, or give the engine a registry.")


def _run(command: list[str], progress: Progress) -> None:
    if os.geteuid() != 0 and command[0].endswith("debootstrap"):
        raise ImageError("debootstrap needs root", "Run `sudo retcon-sandbox images bootstrap`.")
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except OSError as exc:
        raise ImageError(f"cannot run {command[0]}: {exc}") from None
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail, line.rstrip()][-20:]
        if line.startswith(("I: Retrieving", "I: Validating", "I: Extracting", "I: Unpacking",
                            "I: Installing", "I: Configuring")):
            continue  # one line per package: too chatty
        if line.startswith(("I: ", "E: ", "W: ")):
            progress("  " + line.rstrip())
    if proc.wait() != 0:
        raise ImageError(f"{Path(command[0]).name} failed:\n" + "\n".join(tail))
