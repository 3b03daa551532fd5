"""The pieces of a used sandbox's wipe that need no container: `clear` removes what its uid may,
whatever the modes, never through a symlink; the helper's comparison of the sandbox with what it
was at the start. The Docker tier wipes real sandboxes (tests/docker/test_verify_docker.py)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from retcon_sandbox.backends.api import ToolFailure
from retcon_sandbox.backends.local import LocalBackend

supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")
helper = importlib.import_module("retcon_sandbox.sandbox.helper")


def test_clear_empties_a_tree_whatever_its_modes_but_not_the_top(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "file").write_text("x")
    (top / ".hidden").write_text("y")
    (top / "a" / "b").chmod(0)
    (top / "a").chmod(0o100)  # searchable only: its entries cannot be listed or removed
    top.chmod(0o2775)
    supervisor.clear(str(top))
    assert top.is_dir() and not any(top.iterdir())
    assert top.stat().st_mode & 0o7777 == 0o2775  # the top keeps its mode


def test_clear_never_goes_through_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("mine")
    top = tmp_path / "top"
    top.mkdir()
    (top / "link").symlink_to(outside)
    (top / "dir").mkdir()
    (top / "dir" / "link").symlink_to(outside / "kept")
    supervisor.clear(str(top))
    assert not any(top.iterdir())
    assert (outside / "kept").read_text() == "mine"
    supervisor.clear(str(top / "missing"))  # nothing to clear: no error


def test_clear_stops_at_its_depth_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "MAX_DEPTH", 3)
    deep = tmp_path.joinpath("top", *"abcdef")
    deep.mkdir(parents=True)
    supervisor.clear(str(tmp_path / "top"))
    assert (tmp_path / "top" / "a" / "b" / "c").is_dir()  # left: the check finds it


def test_mount_points_are_unescaped_as_the_kernel_wrote_them() -> None:
    assert supervisor._unescaped("/a\\040b\\011c\\134d") == "/a b\tc\\d"
    assert supervisor._unescaped("/plain") == "/plain"
    points = [point for point, _, _ in supervisor.mounts()]
    assert "/" in points and "/proc" in points


def test_differences_name_what_changed_and_what_cannot_be_counted() -> None:
    before = {"/tmp": "0 blocks, 1 files, owner 0:0, mode 41777", "processes": "1 7"}
    assert helper.differences(before, dict(before)) == []
    now = {"/tmp": "8 blocks, 3 files, owner 0:0, mode 41777", "processes": "1 7 12",
           "SysV IPC shm": "1 objects"}
    left = helper.differences(before, now)
    assert left == ["/tmp: 8 blocks, 3 files, owner 0:0, mode 41777 (was 0 blocks, 1 files, "
                    "owner 0:0, mode 41777)", "processes: 1 7 12 (was 1 7)",
                    "SysV IPC shm: 1 objects (new)"]
    uncounted = {"/dev/shm": "0 blocks, uncounted files, owner 0:0, mode 41777"}
    assert helper.differences(uncounted, dict(uncounted)) == [
        "/dev/shm: no inode limit, so its files cannot be counted"]
    assert helper.differences(before, {"processes": "1 7"}) == [
        "/tmp: gone (was 0 blocks, 1 files, owner 0:0, mode 41777)"]


def test_the_sandbox_state_sees_a_new_process_and_holds_counts_only() -> None:
    before = helper.sandbox_state()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = helper.sandbox_state()
    finally:
        child.kill()
        child.wait()
    assert str(child.pid) in now["processes"].split()
    assert str(child.pid) not in before["processes"].split()
    shapes = re.compile(r"-?\d+ blocks, (\d+|uncounted) files, owner \d+:\d+, mode [0-7]+, "
                        r"(\d+|no) attributes|\d+ lines"
                        r"|\d+ entries|-?\d+ objects|[\d ]*")
    assert all(shapes.fullmatch(value) for value in now.values()), now


def test_a_helper_outside_a_sandbox_refuses_to_reset(tmp_path: Path) -> None:
    """The local backend's helper runs on the host: a reset there would empty the host's
    writable tmpfs mounts (/dev/shm, ...). It is refused, and nothing is touched."""
    kept = Path("/dev/shm") / f"retcon-test-{os.getpid()}"
    kept.write_text("mine")
    try:
        with LocalBackend().open("t") as box, pytest.raises(ToolFailure, match="Docker sandbox"):
            box.reset()
        assert kept.read_text() == "mine"
    finally:
        kept.unlink()


def test_copy_tree_goes_as_deep_as_a_setup_made_it(tmp_path: Path) -> None:
    """Python 3.11's os.walk recurses once per level: a tree a setup left 1,200 levels deep
    ended the copy into the workspace (RecursionError) and, with it, the tree's command."""
    deep = os.path.join(*["d"] * 1200)
    (tmp_path / "prepared").mkdir()
    (tmp_path / "workspace").mkdir()
    try:
        fd = os.open(tmp_path / "prepared", os.O_RDONLY)
        for _ in range(1200):  # os.makedirs recurses too
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
            os.close(parent)
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.close(fd)
        (tmp_path / "prepared" / "top.txt").write_text("y")
        copied = supervisor.copy_tree(str(tmp_path / "prepared"), str(tmp_path / "workspace"),
                                      {"top.txt"})
        assert copied == 1
        assert (tmp_path / "workspace" / deep / "leaf").is_file()
        assert not (tmp_path / "workspace" / "top.txt").exists()  # one of the tree's names
    finally:  # pytest's own clean-up (shutil.rmtree) recurses once per level as well
        for top in (tmp_path / "prepared", tmp_path / "workspace"):
            _remove_chain(top)


def _remove_chain(top: Path) -> None:
    """Remove a chain of `d` directories under `top`, deepest first, without recursion."""
    chain = [top]
    while (chain[-1] / "d").is_dir():
        chain.append(chain[-1] / "d")
    for directory in reversed(chain[1:]):
        for entry in directory.iterdir():
            if not entry.is_dir():
                entry.unlink()
        directory.rmdir()


def test_a_git_that_does_not_finish_is_killed_at_the_prepares_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The git metadata has PREPARE_S seconds in all: a git still running then is killed with
    what it started (its session), and the prepare fails, so that the tree's command (in the
    same exec) still gets its whole timeout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text("#!/bin/sh\nsleep 300 &\necho $! > started\nsleep 300\n")
    (bin_dir / "git").chmod(0o755)
    began = time.monotonic()
    code = supervisor.run_git(["init"], str(tmp_path), {"PATH": f"{bin_dir}:/usr/bin:/bin"},
                              None, time.monotonic() + 0.5)
    assert code == supervisor.TIMED_OUT and time.monotonic() - began < 5
    assert "git init: not done within 60 s" in capsys.readouterr().out
    child = int((tmp_path / "started").read_text())
    assert _ends(child), "what the git started is still running"


def _ends(pid: int) -> bool:
    """Whether process `pid` is gone (or a zombie) within 5 seconds."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_child_is_waited_for_from_a_thread_whose_sigchld_another_thread_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The waiting thread blocks SIGCHLD but between its waits; the main thread does not, so
    the kernel hands it a SIGCHLD that comes then, and it ignores it. `wait` still sees the
    child end: CI once waited the whole 60 s of a git step so, in a test calling make_git.
    Here the first look at the child returns only once it has ended and its SIGCHLD is gone."""
    real = os.waitpid
    looked: list[int] = []

    def late(pid: int, options: int) -> tuple[int, int]:
        if not looked:
            looked.append(pid)
            while not _zombie(pid):
                time.sleep(0.01)
            time.sleep(0.2)  # the main thread takes the signal
            return 0, 0
        return real(pid, options)

    found: list[int | None] = []

    def child_and_wait() -> None:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            pid = supervisor.spawn(["true"], "/", dict(os.environ), devnull, devnull)
            found.append(supervisor.wait(pid, 20))
        finally:
            os.close(devnull)

    monkeypatch.setattr(os, "waitpid", late)
    worker = threading.Thread(target=child_and_wait, daemon=True)
    worker.start()
    worker.join(10)
    assert looked and found == [0]


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(") ", 1)[1].startswith("Z")
