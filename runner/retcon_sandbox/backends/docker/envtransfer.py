"""Prepared environments that travel with a CI cache: `images export FILE` writes a repository's
environments (and the base images they were made from) to one file; `images import FILE` loads
them in a later job, for another clone of the same repository.

The file is a tar of two members, in this order: `environments.json`, the manifest, and
`images.tar`, what the engine's `docker save` wrote of the images by ID (so it carries no tag).
The manifest names the repository (the root commits of its history: a clone elsewhere, or a
fork, shares them; another repository does not), each environment's image ID and input record
(LABEL_ENV_INPUTS: what it was made from), each base image's tag and ID, and the archive's size
and SHA-256; it carries an HMAC of all that under the user's notes key (userkey.py:
RETCON_SANDBOX_NOTES_KEY in CI, the secret that authenticates the verification cache too). The
key is the boundary: the root commits only keep one repository's environments from another's
by mistake (a repository can merge another's history, and with it its root).

Nothing of a file reaches the engine before it is checked: the manifest's HMAC must verify
under this user's key, the repository must share a root commit with this one, and the archive
must be a plain member of the signed size that hashes to the signed digest. Only the two
members are read, in order. Then it is loaded: the engine tags nothing of it, so a file whose
images do not come out under the IDs the manifest names (the engine derives an image's ID from
its content) leaves no tag behind. An environment is then tagged under the key this clone
computes for its record (environments are keyed by their repository's scope, which differs from
clone to clone), so a run finds it where it would have prepared it, and a later export of this
clone carries it on. A base image is tagged only where its tag names nothing yet: a newer base
is never rolled back (an environment made from the older one is then simply not used). An
environment whose record cannot be keyed again (no inputs kept: a label over its limit) is not
imported.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from retcon_sandbox import userkey
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine, EngineError
from retcon_sandbox.backends.docker.preparer import repository_scope
from retcon_sandbox.backends.docker.sandboximages import (
    ENV_NAME,
    LABEL_ENV_BASE,
    LABEL_ENV_INPUTS,
    LABEL_ENV_SCOPE,
)
from retcon_sandbox.backends.envkeys import environment_key
from retcon_sandbox.errors import ConfigError, ImageError
from retcon_sandbox.outfile import OutFile
from retcon_sandbox.repo.gitrepo import Repo

MANIFEST = "environments.json"
ARCHIVE = "images.tar"
FORMAT = 2  # 1: archives saved by tag, their size unsigned
MANIFEST_LIMIT = 16 * 1024 * 1024
PURPOSE = b"retcon-sandbox environments\0"  # never the same bytes as a note's HMAC input


@dataclass(frozen=True)
class Moved:
    """What an export wrote or an import loaded: environment tags (this clone's) and bases."""

    environments: list[str]
    bases: list[str]


def roots(repo: Repo) -> list[str]:
    """The root commits of HEAD's history: what names the repository across clones. A shallow
    clone's are its boundary, which another clone does not share: fetch the whole history."""
    found = repo.root_commits("HEAD")
    if not found:
        raise ConfigError("this repository has no commit, so no history names it",
                          "Export and import environments in a repository with commits.")
    return sorted(found)


def _signed(manifest: dict[str, Any]) -> bytes:
    fields = {k: v for k, v in manifest.items() if k != "mac"}
    return PURPOSE + json.dumps(fields, sort_keys=True, ensure_ascii=True,
                                separators=(",", ":")).encode()


# -- export ---------------------------------------------------------------------------------


def output(path: Path) -> OutFile:
    """FILE, as `export` writes it: a new file or a regular file replaced, never through a
    link (outfile.py). Check it (`check`) before anything runs."""
    return OutFile(path, "FILE", "images export", "an export of prepared environments",
                   otherwise=" (without an export, setups prepare the environments again)")


def export(engine: DockerEngine, repo: Repo, path: Path) -> Moved:
    """Write this clone's prepared environments and their base images to `path`: each image
    tagged under the key this clone computes for its record, whether this clone prepared it or
    imported it (its scope label is then the exporting clone's)."""
    scope = repository_scope(repo)
    ours = f"{sandboximages.prefix()}/{ENV_NAME}:"
    envs: list[dict[str, Any]] = []
    ids: set[str] = set()
    bases: dict[str, str] = {}  # a base image's tag -> its ID
    for record in engine.images_labelled(LABEL_ENV_SCOPE):  # any repository's, any user's
        inputs = _loaded(record.labels.get(LABEL_ENV_INPUTS, ""))
        key = _key(inputs, scope) if inputs is not None else None
        tag = next((t for t in record.tags if key is not None and t == ours + key), None)
        base = record.labels.get(LABEL_ENV_BASE, "")
        if tag is None or inputs is None or not base or not engine.has_image(base) or \
                engine.image_id(base) != inputs.get("image"):  # made from an older base
            continue
        envs.append({"id": record.id, "tag": tag, "record": inputs, "base": base})
        bases[base] = engine.image_id(base)
        ids |= {record.id, bases[base]}
    manifest: dict[str, Any] = {
        "v": FORMAT, "roots": roots(repo), "environments": envs, "bases": sorted(bases.items())}
    with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as whole:
        digest = hashlib.sha256()  # the engine's archive first: its hash is signed
        for chunk in engine.save_images(sorted(ids)) if ids else iter(()):
            digest.update(chunk)
            spool.write(chunk)
        manifest["archive"], manifest["size"] = digest.hexdigest(), spool.tell()
        manifest["mac"] = userkey.load().mac(_signed(manifest))
        with tarfile.open(fileobj=whole, mode="w") as tar:
            _add(tar, MANIFEST, io.BytesIO(json.dumps(manifest).encode()))
            _add(tar, ARCHIVE, spool)
        whole.seek(0)
        try:
            output(path).write(whole)
        except OSError as exc:
            raise output(path).unwritten(exc) from None
    return Moved([str(e["id"]) for e in envs], [b for b, _ in manifest["bases"]])


def _add(tar: tarfile.TarFile, name: str, data: IO[bytes]) -> None:
    data.seek(0, os.SEEK_END)
    info = tarfile.TarInfo(name)
    info.size, info.mode = data.tell(), 0o644
    data.seek(0)
    tar.addfile(info, data)


def _key(record: dict[str, Any], scope: str) -> str | None:
    """The key this clone gives an environment made from `record` (what it was made from), or
    None for a record no setup of this version wrote (an image's label is anyone's text)."""
    try:
        return environment_key(str(record["image"]), tuple(record["setup"]),
                               bool(record["git"]), record["tag"], record["inputs"], scope,
                               record.get("reads") == "known")
    except (KeyError, TypeError, ValueError, RecursionError):
        return None


def _loaded(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(value, dict) and isinstance(value.get("inputs"), dict)
    return value if ok else None


# -- import ---------------------------------------------------------------------------------


NOT_LOADED = ("Import only a file `retcon-sandbox images export` wrote for this repository "
              "with the same notes key (RETCON_SANDBOX_NOTES_KEY); without it, setups prepare "
              "the environments again.")


def refused(path: Path, why: str, loaded: bool = False) -> ImageError:
    what = "its images were loaded, untagged, and no run uses them" if loaded else \
        "nothing was loaded"
    return ImageError(f"{path}: {why}; {what}", NOT_LOADED)


def load(engine: DockerEngine, repo: Repo, path: Path) -> Moved:
    """Check `path` (see the module's docstring), load it, and tag its environments under this
    clone's keys."""
    try:
        with open(path, "rb") as handle, tarfile.open(fileobj=handle, mode="r:") as tar:
            manifest = _manifest(tar, path)
            if not set(manifest["roots"]) & set(roots(repo)):
                raise refused(path, "its environments belong to another repository (no root "
                              "commit in common with this one)" + _shallow(repo))
            member = _archive(tar, manifest, path)
            digest = hashlib.sha256()
            archive = _open(tar, member, path)
            for chunk in iter(lambda: archive.read(1 << 20), b""):
                digest.update(chunk)
            if digest.hexdigest() != manifest["archive"]:
                raise refused(path, "its images are not those its manifest names")
            if manifest["environments"]:
                engine.load_images(_open(tar, member, path))
    except (OSError, tarfile.TarError, ValueError, EOFError) as exc:  # tarfile's, on any bytes
        raise refused(path, f"not an export ({exc})") from None
    except EngineError as exc:
        raise ImageError(f"the engine could not load {path}: {exc.message}",
                         "Check that the engine has the disk space for it (`docker system "
                         "df`); without it, setups prepare the environments again.") from None
    return _tag(engine, repo, manifest, path)


def _shallow(repo: Repo) -> str:
    """A hint when this clone's root is only a shallow clone's boundary."""
    return ("; this clone is shallow: fetch its whole history (`git fetch --unshallow`, or "
            "`fetch-depth: 0` in actions/checkout)") if repo.is_shallow() else ""


def _next(tar: tarfile.TarFile, name: str, limit: int, path: Path) -> tarfile.TarInfo:
    """The next member, which must be the plain file `name` of at most `limit` bytes: no link,
    no sparse file (whose few bytes on disk can claim any size)."""
    member = tar.next()
    if member is None or member.name != name or member.type not in (tarfile.REGTYPE,
                                                                     tarfile.AREGTYPE) \
            or member.issparse() or member.size > limit:
        raise refused(path, f"it is not an export (no plain {name} where an export has it)")
    return member


def _open(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> IO[bytes]:
    handle = tar.extractfile(member)
    if handle is None:
        raise refused(path, f"it has no {member.name}")
    return handle


def _archive(tar: tarfile.TarFile, manifest: dict[str, Any], path: Path) -> tarfile.TarInfo:
    """The archive member, once its size is the one signed."""
    size = manifest.get("size")
    member = _next(tar, ARCHIVE, size if isinstance(size, int) else -1, path)
    if member.size != size:
        raise refused(path, "its images are not those its manifest names")
    return member


def _manifest(tar: tarfile.TarFile, path: Path) -> dict[str, Any]:
    """The manifest, once its HMAC verifies under this user's key and its fields read."""
    data = _open(tar, _next(tar, MANIFEST, MANIFEST_LIMIT, path), path).read(MANIFEST_LIMIT)
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        manifest = None
    mac = manifest.get("mac") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or not isinstance(mac, str):
        raise refused(path, "its manifest is not one an export writes")
    if not userkey.load().verify(_signed(manifest), mac):
        raise refused(path, "its manifest does not verify under your notes key (another "
                      "key made it, or it was changed)")
    if manifest.get("v") != FORMAT or not isinstance(manifest.get("environments"), list):
        raise refused(path, "it was written by another version")
    return manifest


def reference(name: str) -> tuple[str, str] | None:
    """An image name as (repository, tag), the tag `latest` when it names none
    (`registry:5000/base` has none); None for a name by digest, which no tag can restore."""
    if "@" in name:
        return None
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        return name, "latest"
    return repository, tag


def _tag(engine: DockerEngine, repo: Repo, manifest: dict[str, Any], path: Path) -> Moved:
    """Each image the manifest names must have loaded under its ID; a base is tagged where its
    tag names nothing yet, and each environment under the key this clone computes for its
    record. Nothing is tagged unless every image loaded."""
    wanted = [str(i) for _, i in manifest["bases"]] + \
        [str(env["id"]) for env in manifest["environments"]]
    if not all(engine.has_image(image_id) for image_id in wanted):
        raise refused(path, "its images are not those its manifest names", loaded=True)
    scope = repository_scope(repo)
    repository = f"{sandboximages.prefix()}/{ENV_NAME}"
    tagged, bases = [], []
    try:
        for base, image_id in manifest["bases"]:
            named = reference(str(base))
            if named is not None and not engine.has_image(base):
                engine.tag_image(str(image_id), *named)
                bases.append(str(base))
        for env in manifest["environments"]:
            key = _key(env["record"], scope)
            if key is not None:  # else not keyed again: not imported (see the docstring)
                engine.tag_image(str(env["id"]), repository, key)
                tagged.append(f"{repository}:{key}")
    except EngineError as exc:
        raise refused(path, f"an image was not tagged ({exc.message})", loaded=True) from None
    return Moved(tagged, bases)
