"""Copy-out: the sandbox's files come back in one streamed batch and become git objects; a
stream that departs from the format is refused with a SandboxError, and nothing but git objects
is ever written on the host."""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.backends.api import HelperSandbox, ToolFailure
from retcon_sandbox.backends.copyout import FRAME_MAX, ExportReader
from retcon_sandbox.backends.local import LocalBackend
from retcon_sandbox.backends.workspace import WorkState, copy_out, sandbox_tree
from retcon_sandbox.errors import GitError, SandboxError
from retcon_sandbox.protocol import (
    EXPORT_BLOCK,
    EXPORT_DATA,
    EXPORT_ERROR,
    EXPORT_HEADER,
    EXPORT_PACKED,
    EXPORT_RAW,
    export_frame,
    export_header,
)
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from tests.test_protocol import Scripted

MAX = 1 << 20


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo.init(tmp_path / "repo")


@pytest.fixture
def box() -> Iterator[HelperSandbox]:
    with LocalBackend().open("test") as sandbox:
        yield sandbox


def host_files(repo: Repo) -> set[str]:
    """Every file of the repository (its .git too) but the object database."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(repo.root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d)
                       != str(repo.root / ".git" / "objects")]
        found.update(os.path.join(dirpath, name) for name in filenames)
    return found


def test_the_workspace_comes_back_as_a_tree(box: HelperSandbox, repo: Repo) -> None:
    names = {f"pkg{i % 7}/mod{i}.py": f"VALUE = {i}\n".encode() * 50 for i in range(300)}
    for name, data in names.items():
        box.write_file(name, data, exact=True)
    box.write_file("bin/run", b"#!/bin/sh\n", "100755", exact=True)
    box.write_file("link", b"bin/run", "120000", exact=True)
    box.write_file("out", b"/etc", "120000", exact=True)  # out of the workspace: kept as a link
    box.write_file("caf\udce9.txt", b"latin-1 name\n", exact=True)
    box.write_file("big.bin", bytes(range(256)) * 9000, exact=True)  # several frames
    box.write_file("empty", b"", exact=True)
    assert box.run("mkdir -p sub/.git && echo x > sub/.git/config && mkfifo fifo "
                   "&& mkdir -p .git && echo y > .git/HEAD && mkdir emptydir", 10).passed

    tree = sandbox_tree(box, repo, 4 * MAX)

    entries = repo.ls_tree(tree)
    assert set(entries) == {*names, "bin/run", "link", "out", "caf\udce9.txt", "big.bin", "empty"}
    assert entries["bin/run"].mode == "100755" and entries["link"].mode == "120000"
    assert repo.blob(entries["out"].sha) == b"/etc"
    assert repo.blob(entries["big.bin"].sha) == bytes(range(256)) * 9000
    assert repo.blob(entries["pkg3/mod3.py"].sha) == names["pkg3/mod3.py"]
    assert repo.blob(entries["empty"].sha) == b""
    assert repo.blob(entries["caf\udce9.txt"].sha) == b"latin-1 name\n"


def test_only_the_paths_asked_for(box: HelperSandbox, repo: Repo) -> None:
    for name in ("a/x.py", "a/y.py", "b/z.py", "c.py"):
        box.write_file(name, name.encode(), exact=True)
    box.write_file("l", b"a", "120000", exact=True)
    got = copy_out(box, repo, MAX, ["a", "c.py", "a/x.py", "gone.py", "l"])
    assert sorted(got) == ["a/x.py", "a/y.py", "c.py", "l"]
    assert got["l"] == TreeEntry("120000", repo.write_blob(b"a"))
    with pytest.raises(ToolFailure, match="symlink"):
        copy_out(box, repo, MAX, ["l/x.py"])  # never through a symlink
    assert "b/z.py" in box.list_files()  # still serving


def test_a_file_over_the_limit_is_refused(box: HelperSandbox, repo: Repo) -> None:
    box.write_file("small", b"x", exact=True)
    box.write_file("huge", b"x" * 2000, exact=True)
    before = host_files(repo)
    with pytest.raises(SandboxError, match=r"huge is 2\.0 KB, over the largest file"):
        copy_out(box, repo, 1000)
    assert host_files(repo) == before
    assert copy_out(box, repo, 1000, ["small"]).keys() == {"small"}


class Streamed(Scripted):
    """A transport whose 'helper' answers `export` with the given file count, then the given
    raw bytes: a stream as something in the sandbox could forge it."""

    def __init__(self, files: int, raw: bytes, wrap: bool = True) -> None:
        super().__init__({"ok": True, "files": files})
        self.raw = io.BytesIO(blocks(raw) if wrap else raw)

    def readline(self) -> bytes:
        assert json.loads(self.sent[-1].split(b"\n", 1)[0])["op"] == "export"
        return super().readline()

    def read(self, n: int) -> bytes:
        return self.raw.read(n)


def blocks(stream: bytes, packed: bool = False) -> bytes:
    """The stream in blocks as the helper sends it: raw, or each one zlib-compressed."""
    out = b""
    for at in range(0, len(stream), EXPORT_BLOCK):
        piece = stream[at : at + EXPORT_BLOCK]
        kind, body = (EXPORT_PACKED, zlib.compress(piece)) if packed else (EXPORT_RAW, piece)
        out += (len(body) + 1).to_bytes(4, "big") + kind + body
    return out


def file_frames(name: bytes, data: bytes, mode: str = "100644") -> bytes:
    return export_header(mode, len(data), name) + (export_frame(EXPORT_DATA, data) if data
                                                   else b"")


END = b"\0\0\0\0"
GOOD = file_frames(b"ok.py", b"fine\n")


@pytest.mark.parametrize("packed", [False, True])
def test_a_well_formed_forged_stream_is_taken(repo: Repo, packed: bool) -> None:
    raw = blocks(GOOD + file_frames(b"d/e", b"") + END, packed)
    box = HelperSandbox(Streamed(2, raw, wrap=False))
    assert copy_out(box, repo, MAX) == {"ok.py": TreeEntry("100644", repo.write_blob(b"fine\n")),
                                        "d/e": TreeEntry("100644", repo.write_blob(b""))}


BOMB = zlib.compress(b"\0" * (EXPORT_BLOCK + 1))
HOSTILE_BLOCKS = {
    "unknown block type": (b"\0\0\0\x02Q!", "a block of type b'Q'"),
    "empty block": (b"\0\0\0\x01R", "an empty block"),
    "block too long": ((EXPORT_BLOCK + 2).to_bytes(4, "big") + b"R", "a block of"),
    "not zlib": (b"\0\0\0\x05Znope", "not zlib"),
    "a zlib bomb": ((len(BOMB) + 1).to_bytes(4, "big") + EXPORT_PACKED + BOMB, "inflates past"),
    "cut short": (blocks(GOOD + END)[:-3], "cut short"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_BLOCKS))
def test_a_hostile_block_is_refused(case: str, repo: Repo) -> None:
    raw, error = HOSTILE_BLOCKS[case]
    before = host_files(repo)
    with pytest.raises(SandboxError, match=error):
        sandbox_tree(HelperSandbox(Streamed(1, raw, wrap=False)), repo, MAX)
    assert host_files(repo) == before


def test_a_compressed_block_with_more_after_its_stream_is_refused(repo: Repo) -> None:
    body = zlib.compress(GOOD + END) + b"extra"
    raw = (len(body) + 1).to_bytes(4, "big") + EXPORT_PACKED + body
    with pytest.raises(SandboxError, match="not one whole zlib stream"):
        copy_out(HelperSandbox(Streamed(1, raw, wrap=False)), repo, MAX)


HOSTILE = {
    "escapes with ..": (2, GOOD + file_frames(b"../outside", b"x") + END, "climbs out"),
    "absolute": (1, file_frames(b"/etc/passwd", b"x") + END, "climbs out"),
    "escapes deeper": (1, file_frames(b"a/../../x", b"x") + END, "climbs out"),
    "not normalised": (1, file_frames(b"a//b", b"x") + END, "not normalised"),
    "dot": (1, file_frames(b"./a", b"x") + END, "not normalised"),
    ".git": (1, file_frames(b".git/hooks/post-commit", b"x") + END, "treats as .git"),
    ".git look-alike": (1, file_frames(b"sub/.GIT./config", b"x") + END, "treats as .git"),
    "NUL in a name": (1, file_frames(b"a\0b", b"x") + END, "NUL"),
    "empty name": (1, file_frames(b"", b"x") + END, "empty"),
    "duplicate": (2, GOOD + GOOD + END, "comes twice"),
    "file, then a directory of that name": (2, GOOD + file_frames(b"ok.py/x", b"x") + END,
                                            "under a name that is a file"),
    "directory, then a file of that name": (2, file_frames(b"a/b", b"x") + file_frames(b"a", b"y")
                                            + END, "as a file and a directory"),
    "oversize": (1, export_header("100644", MAX + 1, b"big") + END, "over the largest file"),
    "long symlink": (1, export_header("120000", 5000, b"l") + END, "over the largest file"),
    "unknown mode": (1, file_frames(b"a", b"x", "160000") + END, "mode '160000'"),
    "truncated frame": (1, GOOD[:-2], "cut short inside a frame"),
    "truncated stream": (2, GOOD, "cut short"),
    "no end frame": (1, GOOD, "cut short"),
    "shorter than its size": (1, export_header("100644", 10, b"a")
                              + export_frame(EXPORT_DATA, b"12345") + END, "short of its size"),
    "longer than its size": (1, export_header("100644", 2, b"a")
                             + export_frame(EXPORT_DATA, b"12345") + END, "longer than its size"),
    "empty data frames": (1, export_header("100644", 2, b"a") + export_frame(EXPORT_DATA, b"")
                          * 3 + END, "empty data frame"),
    "data without a header": (1, GOOD + export_frame(EXPORT_DATA, b"more") + END,
                              "where a file's header was expected"),
    "unknown frame": (1, export_frame(b"Z", b"what") + END, "where a file's header"),
    "more files than announced": (1, GOOD + file_frames(b"b", b"x") + END, "more files than"),
    "fewer files than announced": (3, GOOD + END, "1 files where 3 were announced"),
    "a frame too long": (1, (FRAME_MAX + 1).to_bytes(4, "big") + EXPORT_HEADER, "a frame of"),
    "a header too short": (1, export_frame(EXPORT_HEADER, b"10064") + END, "too short"),
    "an error frame": (1, export_frame(EXPORT_ERROR, b"a\x1b[31m vanished") + END,
                       r"could not copy a file out: a\\e\[31m vanished"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_stream_is_refused_and_nothing_is_written(case: str, repo: Repo) -> None:
    files, raw, error = HOSTILE[case]
    before = host_files(repo)
    box = HelperSandbox(Streamed(files, raw))
    with pytest.raises(SandboxError, match=error):
        sandbox_tree(box, repo, MAX)
    assert host_files(repo) == before  # git objects at most (never referenced), no file


def test_the_reader_holds_one_frame_at_a_time() -> None:
    """A 5 MB file reaches the sink in chunks of at most one frame, never whole."""
    data = b"z" * (5 << 20)
    raw = export_header("100644", len(data), b"big")
    raw += b"".join(export_frame(EXPORT_DATA, data[i : i + (1 << 20)])
                    for i in range(0, len(data), 1 << 20)) + END
    seen: list[int] = []

    def sink(size: int, chunks: Iterator[bytes]) -> str:
        seen.extend(len(chunk) for chunk in chunks)
        return "0" * 40

    reader = ExportReader(io.BytesIO(blocks(raw)).read, 1, 10 << 20, sink)
    assert [f.path for f in reader.files()] == ["big"]
    assert seen == [1 << 20] * 5


def test_copy_in_then_copy_out_is_the_same_tree(box: HelperSandbox, repo: Repo) -> None:
    """What goes in by tar comes back as the same tree, object for object."""
    repo.commit_files("main", {f"d{i % 5}/f{i}.txt": f"{i}\n" * i for i in range(200)}, "init")
    tree = repo.tree_of("main")
    box.load_tree(repo.tree_tar(tree, MAX))
    assert sandbox_tree(box, repo, MAX) == tree


def test_the_wire_of_a_stream() -> None:
    assert export_header("100755", 3, b"a") == b"\0\0\0\x10H100755\0\0\0\0\0\0\0\x03a"
    assert export_frame(EXPORT_DATA, b"xyz") == b"\0\0\0\x04Dxyz"


def test_a_blob_put_into_an_open_sandbox_streams_and_comes_back_whole(box: HelperSandbox,
                                                                      repo: Repo) -> None:
    """`WorkState.put` sends a repository blob as frames (never held whole on the host)."""
    data = bytes(range(256)) * 12_000  # 3 MB: three frames
    repo.commit_files("main", {"README": "r\n"}, "init")
    sha = repo.write_blob(data)
    state = WorkState(repo, lambda _: box, repo.tree_of("main"), repo.resolve("main"), 4 * MAX)
    assert state.box is box
    state.put("bin/tool", TreeEntry("100755", sha))
    assert copy_out(box, repo, 4 * MAX, ["bin"]) == {"bin/tool": TreeEntry("100755", sha)}
    small = WorkState(repo, lambda _: box, repo.tree_of("main"), repo.resolve("main"), MAX)
    assert small.box is box
    with pytest.raises(GitError, match="over the largest file the host reads"):
        small.put("again", TreeEntry("100644", sha))
    assert "again" not in box.list_files()
