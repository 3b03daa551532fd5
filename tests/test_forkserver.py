"""The tests' fork server gives what a fresh `python -m retcon_sandbox` gives: the same output,
error and exit code, the caller's environment and directory, and a process that a time limit
ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import NEUTRAL, Result, cli, make_demo
from tests.forkserver import ForkServer


def both(monkeypatch: pytest.MonkeyPatch, *args: str, cwd: Path | None = None) -> list[Result]:
    """The command through the fork server, then in a fresh interpreter."""
    forked = cli(*args, cwd=cwd)
    with monkeypatch.context() as fresh:
        fresh.setenv("RETCON_SANDBOX_TESTS_FORK", "0")
        return [forked, cli(*args, cwd=cwd)]


@pytest.mark.parametrize("args", [("--version",), ("frobnicate",), ("execute", "-h"),
                                  ("status", "missing.toml"), ("completion", "bash")])
def test_a_forked_command_answers_as_a_fresh_interpreter(
        monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    forked, fresh = both(monkeypatch, *args)
    assert forked == fresh
    assert forked.out or forked.err


def test_the_caller_s_directory_and_environment_reach_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative spec path is found from the caller's directory; DOCKER_HOST names the engine
    that does not answer."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    forked, fresh = both(monkeypatch, "status", demo.spec.name, cwd=demo.path)
    assert forked == fresh and forked.code == 0 and "feature-clean" in forked.out
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nowhere.sock")
    forked, fresh = both(monkeypatch, "images", "list")
    assert forked == fresh and forked.code != 0 and "nowhere.sock" in forked.err


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    """A server of this module's own (not the one `cli` uses), for the tests that need one
    serving: each start imports every library the command line uses, 0.8 s of CPU."""
    started = ForkServer(dict(os.environ))
    yield started
    started.close()


def test_a_variable_read_at_start_up_gets_a_fresh_interpreter(server: ForkServer) -> None:
    for name, value in (("PYTHONIOENCODING", "ascii"), ("LC_ALL", "C"),
                        ("GIT_PYTHON_TRACE", "1")):
        env = {**os.environ, name: value}
        assert server.run(["--version"], NEUTRAL, env, timeout=60) is None, name
    done = server.run(["--version"], NEUTRAL, dict(os.environ), timeout=60)
    assert done is not None and done[0] == 0 and b"retcon-sandbox" in done[1]


def test_each_forked_run_has_a_run_id_of_its_own() -> None:
    """What the command line computes once per process at import is computed again."""
    ids = {json.loads(cli("execute", "missing.toml", "--json").out)["run"] for _ in range(3)}
    assert len(ids) == 3


def test_a_garbled_request_leaves_the_server_serving(server: ForkServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(server._path)
        conn.sendall(b"not a request")
    done = server.run(["--version"], NEUTRAL, dict(os.environ), timeout=60)
    assert done is not None and done[0] == 0
    assert "a request refused" in server.said()


def test_a_command_past_its_time_limit_is_ended_with_what_it_wrote(tmp_path: Path) -> None:
    spec = demo_project.spec_text(True).replace(
        'build = "python3 -m compileall -q shop tests"', 'build = "sleep 20"')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=spec)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        cli("execute", str(demo.spec), "--sandbox", "local", "--non-interactive", timeout=5)
    assert time.monotonic() - started < 30
    assert b"Loading spec" in (stopped.value.output or b"")


def test_a_server_whose_test_process_is_gone_removes_its_folder() -> None:
    """The test process's end closes the server's standard input, however it ended (a killed
    process runs no `close`): the server removes its socket, its log and their folder."""
    server = ForkServer(dict(os.environ))
    folder = Path(server._path).parent
    assert sorted(p.name for p in folder.iterdir()) == ["server.log", "socket"]
    assert server._proc.stdin is not None
    server._proc.stdin.close()  # what the kernel does for a killed test process
    assert server._proc.wait(timeout=30) == 0
    assert not folder.exists()
    server.close()  # and the test process's own clean-up finds nothing left to do
