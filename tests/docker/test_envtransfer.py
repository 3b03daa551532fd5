"""Prepared environments that travel with a CI cache: `images export FILE` in one clone,
`images import FILE` in another clone of the same repository, which then prepares nothing; a
file another key made, a changed archive, or another repository's, loads nothing."""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import cli, git
from tests.docker.test_setup import RUN, events, make_project, prepared

KEY = {"RETCON_SANDBOX_NOTES_KEY": secrets.token_hex(32)}
OTHER_KEY = {"RETCON_SANDBOX_NOTES_KEY": secrets.token_hex(32)}
MADE: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def remove_prepared(engine: DockerEngine) -> Iterator[None]:
    yield
    for tag in set(MADE):
        engine.remove_image(tag)


def setups(clone: Path, spec: Path) -> list[dict[str, object]]:
    """`verify` of the range in `clone` (no result cached there, so each commit runs): the
    setups it ran."""
    result = cli("verify", "main..feature", "--spec", str(spec), "--json", "--no-reuse",
                 "--setup-network", "none", cwd=clone, env=KEY, timeout=900)
    assert result.code == 0, result.out + result.err
    found = events(result.out)
    MADE.extend(prepared(found))
    return [e for e in found if e["event"] == "setup"]


def images(action: str, file: Path, repo: Path, env: dict[str, str], *more: str
           ) -> tuple[int, str]:
    result = cli("images", action, str(file), "--repo", str(repo), *more, env=env, timeout=900)
    return result.code, result.out + result.err


def test_environments_travel_to_another_clone_and_nothing_else_loads(
        engine: DockerEngine, tmp_path: Path) -> None:
    spec = make_project(tmp_path / "origin", {"need.txt": f"{RUN}\n", "t.py": "x = 1\n"},
                        {"a.txt": "a\n", "b.txt": "b\n"},
                        'setup = "cat need.txt > /var/tmp/made"\n'
                        'test = "test -s /var/tmp/made"', ["a.txt"], ["b.txt"])
    origin = spec.parent
    assert len(setups(origin, spec)) == 1  # both trees share one environment
    file = tmp_path / "cache" / "envs.tar"
    file.parent.mkdir()
    os.symlink(tmp_path / "elsewhere", file)
    code, log = images("export", file, origin, KEY)
    assert code == 2 and "not a regular file" in log, log  # never written through
    assert not (tmp_path / "elsewhere").exists()
    file.unlink()
    code, log = images("export", file, origin, KEY)
    assert code == 0 and "Exported 1 prepared environment(s)" in log, log

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)
    git(clone, "branch", "-q", "feature", "origin/feature")
    for tag in set(MADE):  # a new machine: the environment is gone
        engine.remove_image(tag)

    tampered = tmp_path / "tampered.tar"
    _rewrite(file, tampered, archive=lambda data: data[:-1] + bytes([data[-1] ^ 1]))
    code, log = images("import", tampered, clone, KEY)
    assert code == 1 and "are not those its manifest names" in log, log
    code, log = images("import", file, clone, OTHER_KEY)
    assert code == 1 and "does not verify under your notes key" in log, log
    stranger = make_project(tmp_path / "stranger", {"x.txt": "x\n"}, {"y.txt": "y\n"}, "",
                            ["y.txt"], ["y.txt"]).parent
    code, log = images("import", file, stranger, KEY)
    assert code == 1 and "belong to another repository" in log, log
    assert not any(engine.has_image(tag) for tag in set(MADE))  # nothing was loaded

    for name, hostile in _hostile(file).items():  # each refused quickly, as a refusal
        started = time.monotonic()
        code, log = images("import", _write(tmp_path / f"{name}.tar", hostile), clone, KEY)
        assert code == 1 and "nothing was loaded" in log and "internal error" not in log, log
        assert time.monotonic() - started < 60, name

    code, log = images("import", file, clone, KEY, "--json")
    (imported,) = [e for e in events(log) if e["event"] == "environments_imported"]
    MADE.extend(imported["environments"])  # type: ignore[arg-type]
    assert code == 0 and len(imported["environments"]) == 1, log  # type: ignore[arg-type]
    assert setups(clone, spec) == []  # found where the clone's own setup would have put it
    code, log = images("export", tmp_path / "again.tar", clone, KEY)  # and travels on
    assert code == 0 and "Exported 1 prepared environment(s)" in log, log


def _hostile(export: Path) -> dict[str, list[tuple[tarfile.TarInfo, bytes]]]:
    """Files made from a genuine export by someone without the key: its members reordered, an
    archive that claims a petabyte in 512 bytes (a sparse member) beside the genuine manifest,
    and manifests that only a parser would choke on."""
    with tarfile.open(export) as tar:
        manifest, archive = (_read(tar, name) for name in ("environments.json", "images.tar"))
    sparse = tarfile.TarInfo("images.tar")
    sparse.size, sparse.pax_headers = 512, {"GNU.sparse.size": str(10 ** 15),
                                            "GNU.sparse.map": "0,512",
                                            "GNU.sparse.name": "images.tar"}
    mac = json.loads(manifest)["mac"]
    return {
        "reordered": [_info("images.tar", archive), _info("environments.json", manifest)],
        "sparse": [_info("environments.json", manifest), (sparse, b"A" * 512)],
        "deep": [_info("environments.json", b"[" * 200_000), _info("images.tar", b"")],
        "accented": [_info("environments.json", manifest.replace(mac.encode(),
                                                                 "é".encode() * 64)),
                     _info("images.tar", archive)],
    }


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    handle = tar.extractfile(name)
    assert handle is not None
    return handle.read()


def _info(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _write(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as out:
        for info, data in members:
            out.addfile(info, io.BytesIO(data))
    return path


def _rewrite(source: Path, target: Path, archive: Callable[[bytes], bytes]) -> None:
    """A copy of an export with its archive member changed by `archive` (bytes -> bytes)."""
    with tarfile.open(source) as tar, tarfile.open(target, "w") as out:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            assert handle is not None
            data = handle.read()
            if member.name == "images.tar":
                data = archive(data)
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))  # the manifest as it was, HMAC and all
