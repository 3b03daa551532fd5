"""The in-sandbox helper's protocol, tools and commands, through the local backend.

The same helper runs inside every container; the Docker tier repeats the hostile cases there.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.archive import TarStream, of_bytes
from retcon_sandbox.backends.api import HelperSandbox, Sandbox, ToolFailure
from retcon_sandbox.backends.local import LocalBackend
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.repo.gitrepo import Repo


def tar_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> TarStream:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return of_bytes(buffer.getvalue(), len(files) + len(links or {}))


@pytest.fixture
def box() -> Iterator[HelperSandbox]:
    with LocalBackend().open("test") as sandbox:
        sandbox.load_tree(tar_of({"src/app.py": b"".join(b"line %d\n" % i for i in range(1, 51)),
                                  "data.bin": b"\x00\x01\x02"},
                                 {"escape": "/etc", "inside": "src"}))
        yield sandbox


def test_read_is_line_numbered_and_pages(box: HelperSandbox) -> None:
    whole = box.read_file("src/app.py")
    assert whole.lines == 50 and whole.text.startswith("     1\tline 1\n")
    page = box.read_file("src/app.py", offset=10, limit=3)
    assert page.text == "    10\tline 10\n    11\tline 11\n    12\tline 12\n"


def test_binary_files_are_described_not_dumped(box: HelperSandbox) -> None:
    result = box.read_file("data.bin")
    assert result.binary and "binary file (3 bytes)" in result.text
    assert box.write_file("new.bin", b"\xff\x00").summary == "Created binary file new.bin (2 bytes)"


def test_writes_answer_with_counts_noop_and_diff_for_large_rewrites(box: HelperSandbox) -> None:
    original = box.read_file("src/app.py").text
    assert "line 1" in original
    small = box.write_file("src/app.py", b"".join(
        (b"LINE %d\n" if i == 3 else b"line %d\n") % i for i in range(1, 51)))
    assert small.summary.endswith("+1 -1)") and small.diff is None
    same = box.write_file("src/app.py", b"".join(
        (b"LINE %d\n" if i == 3 else b"line %d\n") % i for i in range(1, 51)))
    assert same.status == "unchanged" and same.summary.startswith("no changes")
    big = box.write_file("src/app.py", b"".join(b"new %d\n" % i for i in range(1, 51)))
    assert "+50 -50" in big.summary and big.diff is not None
    assert big.diff.startswith("--- a/src/app.py\n+++ b/src/app.py\n@@ -1,50 +1,50 @@\n-line 1\n")
    assert "+new 50\n" in big.diff
    created = box.write_file("pkg/deep/new.py", b"x = 1\n")
    assert created.summary == "Created pkg/deep/new.py (6 B, 1 lines)"


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "src/../../x", ".git/config"])
def test_paths_stay_in_the_workspace(box: HelperSandbox, path: str) -> None:
    with pytest.raises(ToolFailure):
        box.write_file(path, b"x")
    if not path.startswith(".git"):
        with pytest.raises(ToolFailure):
            box.read_file(path)


def test_symlinks_out_of_the_workspace_are_not_followed(box: HelperSandbox) -> None:
    with pytest.raises(ToolFailure, match="points outside the workspace"):
        box.read_file("escape/passwd")
    with pytest.raises(ToolFailure, match="goes through a symlink"):
        box.write_file("escape/evil", b"x")
    with pytest.raises(ToolFailure, match="goes through a symlink"):
        box.delete_file("escape")
    assert box.read_file("inside/app.py").lines == 50  # a link that stays inside is fine to read


def test_commands_report_exit_code_and_output(box: HelperSandbox) -> None:
    result = box.run("echo out; echo err >&2; exit 4", 10)
    assert (result.exit_code, result.output, result.passed) == (4, "out\nerr\n", False)
    assert box.run("test -f src/app.py", 10).passed


@pytest.mark.parametrize("name", ["python3", "python"])
def test_python_in_commands_is_the_interpreter_running_the_tests(box: HelperSandbox,
                                                                 name: str) -> None:
    """The tests' `python3 -m pytest` commands get this interpreter and its packages (its venv,
    activated or not), never whatever `python3` comes first on the caller's PATH."""
    result = box.run(f"{name} -c 'import sys; print(sys.prefix); print(sys.version)'", 30)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:2] == [sys.prefix, sys.version.splitlines()[0]]


def test_timeout_kills_the_whole_tree(box: HelperSandbox) -> None:
    result = box.run("(sleep 300 & echo $! > bg.pid; wait) & sleep 300", 1)
    assert result.timed_out and result.seconds < 10
    check = box.run('kill -0 "$(cat bg.pid)" 2>/dev/null && echo alive || echo gone', 10)
    assert check.output.strip() == "gone"


def test_background_processes_do_not_outlive_their_command(box: HelperSandbox) -> None:
    started = box.run("setsid sh -c 'sleep 300' & echo $! > bg.pid", 10)
    assert started.passed and started.seconds < 5
    check = box.run('kill -0 "$(cat bg.pid)" 2>/dev/null && echo alive || echo gone', 10)
    assert check.output.strip() == "gone"


def test_output_is_capped_with_head_tail_and_total(box: HelperSandbox) -> None:
    result = box.run("echo FIRST; yes filler | head -c 5000000; echo; echo LAST", 30)
    assert result.truncated and result.total_bytes > 5_000_000
    assert result.output.startswith("FIRST") and result.output.rstrip().endswith("LAST")
    assert len(result.output) < 100_000 and "bytes of output omitted" in result.output


def test_unknown_operations_and_bad_requests_are_answered(box: HelperSandbox) -> None:
    with pytest.raises(ToolFailure, match="unknown operation"):
        box.request("format_disk")
    with pytest.raises(ToolFailure, match="bad request"):
        box.request("read")
    assert box.read_file("src/app.py").lines == 50  # still serving


def test_a_tree_with_a_top_level_git_entry_is_refused(box: HelperSandbox) -> None:
    with pytest.raises(ToolFailure, match=r"\.git"):
        box.load_tree(tar_of({".git": b"gitdir: /etc\n"}))


def test_a_fifo_left_by_a_build_is_refused_not_opened(box: HelperSandbox) -> None:
    assert box.run("mkfifo pipe", 10).passed
    with pytest.raises(ToolFailure, match="not a regular file"):
        box.read_file("pipe")
    with pytest.raises(ToolFailure, match="not a regular file"):
        box.write_file("pipe", b"x")
    assert box.delete_file("pipe") == "Deleted pipe"


def test_list_files_answers_a_bounded_number_of_names(box: HelperSandbox) -> None:
    assert box.run("mkdir many && cd many && seq 20005 | xargs touch", 60).passed
    names = box.list_files("many")
    assert len(names) == 20_001 and names[-1].startswith("[... 5 more names not listed")


def test_an_identical_write_is_recorded(tmp_path: Path) -> None:
    """The sandbox's copy is not the record: a build may have written the very bytes the model
    then writes. The write is recorded all the same, so the commit holds what the model wrote."""
    repo = Repo.init(tmp_path / "repo")
    sha = repo.commit_files("main", {"app.py": "x = 1\n"}, "base")
    with contextlib.ExitStack() as stack:
        def opener(tree: str) -> Sandbox:
            opened = stack.enter_context(LocalBackend().open("t"))
            opened.load_tree(repo.tree_tar(tree, 1 << 20))
            return opened

        state = WorkState(repo, opener, repo.tree_of(sha), sha, 1 << 20)
        result = state.box.run("printf 'x = 2\\n' > app.py", 30)  # what a build may do
        assert result.exit_code == 0
        assert "no changes" in state.write_file("app.py", "x = 2\n")
        assert [c.path for c in state.changes()] == ["app.py"]
        assert repo.blob(repo.ls_tree(state.tree())["app.py"].sha) == b"x = 2\n"
