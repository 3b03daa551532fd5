"""Prepared environments that travel with a CI cache: `images export FILE` writes a repository's
environments (and the base images they were made from) to one file; `images import FILE` loads
them in a later job, for another clone of the same repository.

The file is a tar of two members: `environments.json`, the manifest, and `images.tar`, what the
engine's `docker save` wrote. The manifest names the repository (the root commits of its
history: a clone elsewhere, or a fork, shares them; another repository does not), each
environment's image ID and input record (LABEL_ENV_INPUTS: what it was made from), each base
image's tag and ID, and the archive's SHA-256; it carries an HMAC of all that under the user's
notes key (userkey.py: RETCON_SANDBOX_NOTES_KEY in CI, the secret that authenticates the
verification cache too).

Nothing of a file reaches the engine before it is checked: the manifest's HMAC must verify
under this user's key, the repository must share a root commit with this one, and the archive
must hash to what the manifest says. Only then is it loaded, and each image must come out under
the ID the manifest names (the engine derives an image's ID from its content). An environment
is then tagged under the key this clone computes for its record (environments are keyed by
their repository's scope, which differs from clone to clone), so a run finds it where it would
have prepared it. An environment whose record cannot be keyed again (no inputs kept: a label
over its limit) is not imported.
"""

from __future__ import annotations

import contextlib
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
from retcon_sandbox.backends.envkeys import environment_key, scope_digest
from retcon_sandbox.errors import ConfigError, ImageError
from retcon_sandbox.outfile import OutFile
from retcon_sandbox.repo.gitrepo import Repo

MANIFEST = "environments.json"
ARCHIVE = "images.tar"
FORMAT = 1
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
    """Write this repository's prepared environments and their base images to `path`."""
    scope = repository_scope(repo)
    records = engine.images_labelled(LABEL_ENV_SCOPE, scope_digest(scope))
    envs: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # a tag to save -> its image's ID
    for record in records:
        ours = f"{sandboximages.prefix()}/{ENV_NAME}:"
        tag = next((t for t in record.tags if t.startswith(ours)), None)
        inputs = _loaded(record.labels.get(LABEL_ENV_INPUTS, ""))
        base = record.labels.get(LABEL_ENV_BASE, "")
        if tag is None or inputs is None or not base or not engine.has_image(base) or \
                engine.image_id(base) != inputs.get("image"):  # made from an older base
            continue
        envs.append({"id": record.id, "tag": tag, "record": inputs, "base": base})
        names[tag] = record.id
        names[base] = engine.image_id(base)
    manifest: dict[str, Any] = {
        "v": FORMAT, "roots": roots(repo), "environments": envs,
        "bases": sorted({env["base"]: names[env["base"]] for env in envs}.items())}
    with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as whole:
        digest = hashlib.sha256()  # the engine's archive first: its hash is signed
        for chunk in engine.save_images(sorted(names)) if names else iter(()):
            digest.update(chunk)
            spool.write(chunk)
        manifest["archive"] = digest.hexdigest()
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


def _loaded(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    ok = isinstance(value, dict) and isinstance(value.get("inputs"), dict)
    return value if ok else None


# -- import ---------------------------------------------------------------------------------


def refused(path: Path, why: str) -> ImageError:
    return ImageError(f"{path}: {why}; nothing was loaded",
                      "Import only a file `retcon-sandbox images export` wrote for this "
                      "repository with the same notes key (RETCON_SANDBOX_NOTES_KEY); without "
                      "it, setups prepare the environments again.")


def load(engine: DockerEngine, repo: Repo, path: Path) -> Moved:
    """Check `path` (see the module's docstring), load it, and tag its environments under this
    clone's keys."""
    try:
        with open(path, "rb") as handle, tarfile.open(fileobj=handle, mode="r:") as tar:
            manifest = _manifest(tar, path)
            if not set(manifest["roots"]) & set(roots(repo)):
                raise refused(path, "its environments belong to another repository (no root "
                              "commit in common with this one)")
            archive = _member(tar, ARCHIVE, path)
            digest = hashlib.sha256()
            for chunk in iter(lambda: archive.read(1 << 20), b""):
                digest.update(chunk)
            if digest.hexdigest() != manifest["archive"]:
                raise refused(path, "its images are not those its manifest names")
            if manifest["environments"]:
                engine.load_images(_member(tar, ARCHIVE, path))
    except (OSError, tarfile.TarError) as exc:
        raise refused(path, f"not an export ({exc})") from None
    except EngineError as exc:
        raise ImageError(f"the engine could not load {path}: {exc.message}") from None
    return _tag(engine, repo, manifest, path)


def _member(tar: tarfile.TarFile, name: str, path: Path) -> IO[bytes]:
    member = tar.getmember(name) if name in tar.getnames() else None
    handle = tar.extractfile(member) if member is not None and member.isfile() else None
    if handle is None:
        raise refused(path, f"it has no {name}")
    return handle


def _manifest(tar: tarfile.TarFile, path: Path) -> dict[str, Any]:
    """The manifest, once its HMAC verifies under this user's key and its fields read."""
    handle = _member(tar, MANIFEST, path)
    data = handle.read(MANIFEST_LIMIT + 1)
    try:
        manifest = json.loads(data) if len(data) <= MANIFEST_LIMIT else None
    except ValueError:
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


def _tag(engine: DockerEngine, repo: Repo, manifest: dict[str, Any], path: Path) -> Moved:
    """Each loaded image must have the ID the manifest names; each environment is tagged under
    the key this clone computes for its record."""
    for base, image_id in manifest["bases"]:
        if engine.image_id(base) != image_id:
            raise refused(path, f"the engine holds another image under {base}")
    scope = repository_scope(repo)
    repository = f"{sandboximages.prefix()}/{ENV_NAME}"
    tagged = []
    for env in manifest["environments"]:
        record = env["record"]
        key = environment_key(str(record["image"]), tuple(record["setup"]),
                              bool(record["git"]), record["tag"], record["inputs"], scope,
                              record.get("reads") == "known")
        try:
            engine.tag_image(str(env["id"]), repository, key)
        except EngineError as exc:
            raise refused(path, f"an environment was not loaded ({exc.message})") from None
        if env["tag"] != f"{repository}:{key}":  # the exporting clone's name for it
            with contextlib.suppress(ImageError):
                engine.remove_image(str(env["tag"]))
        tagged.append(f"{repository}:{key}")
    return Moved(tagged, [b for b, _ in manifest["bases"]])
