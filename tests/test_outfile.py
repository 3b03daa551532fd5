"""Output files (outfile.py, behind `plan -o` and `verify --junit`): checked before anything
runs, never written through a link or over anything but a regular file, written whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retcon_sandbox.errors import SpecError, UsageError
from retcon_sandbox.outfile import OutFile


def out(path: Path, replace: bool = True) -> OutFile:
    return OutFile(path, "--junit", "verify", "a JUnit report", replace=replace)


def left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_new_file_is_written_whole_and_a_regular_one_replaced(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    out(report).check()
    assert left(tmp_path) == []  # the dry run leaves nothing
    out(report).write(b"one\n")
    report.chmod(0o600)
    inode = report.stat().st_ino
    out(report).write(b"two\n")
    assert report.read_bytes() == b"two\n" and report.stat().st_ino != inode
    assert left(tmp_path) == ["junit.xml"]


def test_without_replace_an_existing_file_is_kept(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text("mine\n")
    keep = OutFile(spec, "-o", "plan", "a spec file", replace=False, error=SpecError,
                   exists_hint="Give --force.")
    with pytest.raises(SpecError, match="exists; plan does not overwrite it"):
        keep.check()
    with pytest.raises(SpecError, match="appeared while plan was working"):
        keep.write(b"theirs\n")
    assert spec.read_text() == "mine\n" and left(tmp_path) == ["spec.toml"]


def test_a_link_or_anything_but_a_regular_file_is_never_written(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep\n")
    link, dangling, fifo, folder = (tmp_path / name for name in ("l", "d", "p", "f"))
    link.symlink_to(target)
    dangling.symlink_to(tmp_path / "nowhere")
    os.mkfifo(fifo)
    folder.mkdir()
    for path, kind in ((link, "a symbolic link"), (dangling, "a symbolic link"),
                       (fifo, "a named pipe"), (folder, "a directory")):
        for step in (out(path).check, lambda p=path: out(p).write(b"x")):
            with pytest.raises(UsageError, match=f"is {kind}, not a regular file"):
                step()
    assert target.read_text() == "keep\n" and not (tmp_path / "nowhere").exists()
    assert left(tmp_path) == ["d", "f", "l", "p", "precious"]


def test_a_folder_that_takes_no_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot write --junit /proc/junit\.xml: ") as caught:
        out(Path("/proc/junit.xml")).check()
    assert "Nothing was written" in caught.value.hint
    with pytest.raises(UsageError, match="not a file in an existing directory"):
        out(tmp_path / "missing" / "j.xml").check()
    with pytest.raises(UsageError, match="File name too long"):
        out(tmp_path / ("j" * 300)).check()
