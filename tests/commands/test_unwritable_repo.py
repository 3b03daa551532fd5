"""A repository whose object database cannot take a new object (read-only, a full disk): the
verification cache stops writing with a warning and the verdict stands; a reconstruction, which
must write, stops with a git error. Never an internal error."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import Demo, cli, git

LOCAL = ("--sandbox", "local")


def refuse_new_objects(repo: Path) -> None:
    """Every object packed, and each fan-out directory a file: git can read every object but
    cannot write a loose one (`unable to create temporary file`), for root too, which a
    read-only mode would not stop."""
    objects = repo / ".git" / "objects"
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "prune-packed")
    for fanout in (f"{n:02x}" for n in range(256)):
        path = objects / fanout
        if path.is_dir():
            shutil.rmtree(path)
        path.write_bytes(b"")


def test_verify_warns_that_results_were_not_cached_and_keeps_its_verdict(demo: Demo) -> None:
    refuse_new_objects(demo.path)
    result = cli("verify", "main..feature~8", *LOCAL, "--build", "true", cwd=demo.path)
    assert result.code == 0, result.out + result.err
    assert "results were not cached: cannot write an object into the repository" \
        in result.out + result.err
    assert "2 commits: 2 passed" in result.out + result.err
    assert "internal error" not in result.err and "Traceback" not in result.err


def test_execute_stops_with_a_git_error(demo: Demo) -> None:
    refuse_new_objects(demo.path)
    result = cli("execute", str(demo.spec), *LOCAL, "--non-interactive")
    assert result.code == 1, result.out + result.err
    assert "✗ error: git " in result.err or "cannot write an object" in result.err
    assert "internal error" not in result.err and "Traceback" not in result.err
