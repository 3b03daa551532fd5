"""The source distribution: it holds everything a checkout tracks (so its tests run from an
unpacked copy), and the build is clean of setuptools' warnings about what it would ignore."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT, building_from_root


def _setuptools_major() -> int:
    try:
        return int(metadata.version("setuptools").split(".")[0])
    except metadata.PackageNotFoundError:
        return 0


pytestmark = [
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout"),
    # the build backend pyproject.toml requires (pip would install it in an isolated build)
    pytest.mark.skipif(_setuptools_major() < 77, reason="needs setuptools>=77, as the build"),
]
BUILD = ("import sys; from setuptools import build_meta as b; "
         "print(b.build_sdist(sys.argv[1]) if sys.argv[2] == 'sdist' "
         "else b.build_wheel(sys.argv[1]))")


def build(kind: str, into: Path) -> tuple[Path, str]:
    with building_from_root():
        proc = subprocess.run([sys.executable, "-W", "always", "-c", BUILD, str(into), kind],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return into / proc.stdout.strip().splitlines()[-1], proc.stdout + proc.stderr


def test_the_sdist_holds_every_tracked_file(tmp_path: Path) -> None:
    sdist, _ = build("sdist", tmp_path)
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {n.removeprefix(top + "/") for n in archive.getnames()}
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    missing = [t for t in tracked if t not in names and t != ".gitignore"
               and (ROOT / t).exists()]
    assert missing == []
    assert {"LICENSE", "tests/conftest.py", "constraints/dev.txt", "docs/ci/github-actions.yml"
            } <= names


def test_building_warns_of_nothing_ignored_or_deprecated(tmp_path: Path) -> None:
    _, output = build("wheel", tmp_path)
    assert "would be ignored" not in output
    assert "is absent from the `packages` configuration" not in output
    assert "DeprecationWarning" not in output


def _docker_ignores(pattern: str, path: str) -> bool:
    """Docker's rule for the plain patterns .dockerignore uses here: a name matches that path
    from the context's root, `**/` any number of folders before it."""
    from fnmatch import fnmatchcase

    parts = path.split("/")
    if pattern.startswith("**/"):
        return any(fnmatchcase(part, pattern[3:]) for part in parts)
    return fnmatchcase(parts[0], pattern)


def test_the_build_context_leaves_out_a_checkouts_environment_and_build_output() -> None:
    """`docker compose build` sends the checkout as its context: not its .venv (hundreds of
    megabytes), nor build/ and dist/; but the wheels the runner image may install from."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        return any(_docker_ignores(p, path) for p in patterns)

    for path in (".venv/bin/python", "build/lib/retcon_sandbox/cli.py",
                 "dist/retcon_sandbox-0.3.0.tar.gz", ".git/HEAD",
                 "runner/retcon_sandbox/__pycache__/cli.cpython-311.pyc"):
        assert ignored(path), path
    for path in ("wheels/retcon_sandbox-0.3.0-py3-none-any.whl", "pyproject.toml",
                 "images/runner/entrypoint.sh", "runner/retcon_sandbox/cli.py", "README.md"):
        assert not ignored(path), path
