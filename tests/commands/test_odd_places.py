"""Where a command runs from, and names it is given, that the file system cannot take: a current
directory that was deleted, a revision range longer than a file name may be. Each is an answer
or a clear error, never an internal one."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import CLI, Demo, Result, cli

LOCAL = ("--sandbox", "local")


# What a run builds and tests does not matter here (the spec and repository found does): each
# commit's build and tests are a shell's `true`, not the demo's compileall and pytest.
CHEAP = ("--build", "true", "--test", "true")


def from_deleted_directory(tmp_path: Path, *args: str) -> Result:
    """The real CLI started in a directory removed just before it runs."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    proc = subprocess.run(["sh", "-c", script, "sh", str(gone), *CLI, *args],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_a_deleted_current_directory_is_no_repository(demo: Demo, tmp_path: Path) -> None:
    result = from_deleted_directory(tmp_path, "verify", "main..feature", *LOCAL, "--build",
                                    "true")
    assert result.code == 1, result.out + result.err
    assert "no git repository here (the current directory no longer exists)" in result.err
    assert "give --repo DIR" in result.err and "internal error" not in result.err


def test_from_a_deleted_directory_the_spec_and_repo_are_found(demo: Demo,
                                                              tmp_path: Path) -> None:
    verified = from_deleted_directory(tmp_path, "verify", "main..feature~8", *LOCAL, "--build",
                                      "true", "--repo", str(demo.path))
    assert verified.code == 0, verified.out + verified.err
    executed = from_deleted_directory(tmp_path, "execute", str(demo.spec), *LOCAL,
                                      "--non-interactive", *CHEAP)
    assert executed.code == 0, executed.out + executed.err
    assert "feature-clean" in demo.git("branch", "--list")


def test_a_revision_range_longer_than_a_file_name_is_a_range(demo: Demo) -> None:
    branch = "b" * 250
    demo.git("branch", branch, "feature~8")
    result = cli("verify", f"main..{branch}", *LOCAL, "--build", "true", cwd=demo.path)
    assert result.code == 0, result.out + result.err
    assert "2 commits: 2 passed" in result.out and "internal error" not in result.err


def test_plan_from_a_deleted_directory_finds_its_repo(demo: Demo, tmp_path: Path) -> None:
    planned = from_deleted_directory(tmp_path, "plan", "--repo", str(demo.path), "--source",
                                     "feature")
    assert planned.code == 0, planned.out + planned.err
    assert "[[commit]]" in planned.out
    alone = from_deleted_directory(tmp_path, "plan", "--source", "feature")
    assert alone.code == 1 and "the current directory no longer exists" in alone.err


def test_a_spec_path_too_long_to_read_and_a_long_base_url_are_clear_errors(demo: Demo,
                                                                           tmp_path: Path) -> None:
    result = cli("status", str(tmp_path / ("d" * 300) / "x.toml"))
    assert result.code == 1 and "cannot read: File name too long" in result.err, result.err
    url = "http://" + "a" * 3000 + ".com/v1"
    result = cli("execute", str(demo.spec), *LOCAL, "--base-url", url)
    assert result.code == 2 and "(3014 characters) is not an endpoint's base URL" in result.err
    assert url not in result.err and "internal error" not in result.err
