"""The sandbox images: which exist, how to build them, and how to bootstrap a base offline.

Where a registry answers, the Dockerfiles in images/ build the ordinary way (FROM
debian:bookworm-slim). Where none does, a Debian root filesystem is made with debootstrap from
Debian's package mirror, loaded with `docker import`, and passed to the same Dockerfiles as BASE.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.docker_backend import DockerEngine
from runner.errors import ImageError

IMAGES_DIR = Path(os.environ.get("RETCON_SANDBOX_IMAGES",
                                 Path(__file__).resolve().parent.parent / "images"))
REGISTRY_BASE = "debian:bookworm-slim"
ROOTFS_REPO, ROOTFS_TAG = "retcon-sandbox/debian", "bookworm"
ROOTFS = f"{ROOTFS_REPO}:{ROOTFS_TAG}"
ROOTFS_PACKAGES = "python3,python3-pytest,git,gcc,make,libc6-dev,passwd"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ImageDef:
    name: str
    tag: str
    base: str | None  # another ImageDef's name, or None for the Debian base


CATALOG = {
    "base": ImageDef("base", "retcon-sandbox/base:latest", None),
    "node": ImageDef("node", "retcon-sandbox/node:latest", "base"),
}
DEFAULT_IMAGE = CATALOG["base"].tag


def by_tag(tag: str) -> ImageDef | None:
    return next((d for d in CATALOG.values() if d.tag == tag or d.tag == f"{tag}:latest"), None)


def ensure(engine: DockerEngine, tag: str, progress: Progress) -> None:
    """Make `tag` available: present, or built from images/ (bootstrapping if need be)."""
    if engine.has_image(tag):
        return
    definition = by_tag(tag)
    if definition is None:
        if engine.try_pull(tag):
            return
        raise ImageError(f"image {tag} is not available and could not be pulled",
                         "Build or load it (`docker build`, `docker load`), or use one of ours: "
                         + ", ".join(d.tag for d in CATALOG.values()))
    progress(f"Image {tag} is not built yet: building it (first use only)...")
    build(engine, definition.name, progress)


def build(engine: DockerEngine, name: str, progress: Progress) -> str:
    definition = CATALOG.get(name)
    if definition is None:
        raise ImageError(f"no image named {name!r}", "Known: " + ", ".join(CATALOG))
    if definition.base is None:
        base = debian_base(engine, progress)
    else:
        base = CATALOG[definition.base].tag
        if not engine.has_image(base):
            build(engine, definition.base, progress)
    context = IMAGES_DIR / name
    if not (context / "Dockerfile").exists():
        raise ImageError(f"{context}/Dockerfile is missing",
                         "Run from a checkout of retcon-sandbox, or set RETCON_SANDBOX_IMAGES.")
    progress(f"Building {definition.tag} (FROM {base})...")
    engine.build(context, definition.tag, {"BASE": base}, lambda line: progress("  " + line))
    return definition.tag


def debian_base(engine: DockerEngine, progress: Progress) -> str:
    """debian:bookworm-slim if it is here or a registry gives it; else a bootstrapped rootfs."""
    if engine.has_image(REGISTRY_BASE):
        return REGISTRY_BASE
    if engine.has_image(ROOTFS):
        return ROOTFS
    progress(f"Trying to pull {REGISTRY_BASE}...")
    if engine.try_pull(REGISTRY_BASE):
        return REGISTRY_BASE
    progress("No registry answers: bootstrapping a Debian base from packages instead.")
    bootstrap(engine, progress)
    return ROOTFS


def bootstrap(engine: DockerEngine, progress: Progress) -> str:
    """debootstrap a minimal Debian bookworm with our packages and `docker import` it."""
    debootstrap = _debootstrap(progress)
    mirror = os.environ.get("RETCON_SANDBOX_DEBIAN_MIRROR", DEFAULT_MIRROR)
    work = Path(tempfile.mkdtemp(prefix="retcon-rootfs-", dir="/var/tmp"))
    rootfs = work / "rootfs"
    try:
        progress(f"debootstrap --variant=minbase bookworm from {mirror} (about a minute)...")
        _run([debootstrap, "--variant=minbase", f"--include={ROOTFS_PACKAGES}", "bookworm",
              str(rootfs), mirror], progress)
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        progress(f"docker import → {ROOTFS}...")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        assert tar.stdout is not None
        engine.import_rootfs(tar.stdout, ROOTFS_REPO, ROOTFS_TAG)
        if tar.wait() != 0:
            raise ImageError("packing the root filesystem failed (tar)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"Bootstrapped {ROOTFS}.")
    return ROOTFS


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
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
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
