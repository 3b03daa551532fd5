"""Prepared environments that travel with a CI cache: `images export FILE` in one clone,
`images import FILE` in another clone of the same repository, which then prepares nothing; a
file another key made, a changed archive, or another repository's, loads nothing."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import tarfile
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
    for tag in MADE:
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


def images(action: str, file: Path, repo: Path, env: dict[str, str]) -> tuple[int, str]:
    result = cli("images", action, str(file), "--repo", str(repo), env=env, timeout=900)
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

    code, log = images("import", file, clone, KEY)
    assert code == 0 and "Imported 1 prepared environment(s)" in log, log
    assert setups(clone, spec) == []  # found where the clone's own setup would have put it


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
