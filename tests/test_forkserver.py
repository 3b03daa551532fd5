"""The tests' fork server gives what a fresh `python -m retcon_sandbox` gives: the same output,
error and exit code, the caller's environment and directory, and a process that a time limit
ends. So does the server of the projects' `python3 -m pytest`, behind the tests' `python3`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import (
    COMMAND_ENV,
    NEUTRAL,
    Result,
    cli,
    make_demo,
    projects_pytest_server,
    write_interpreter,
)
from tests.forkclient import umask_of_this_process
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
    assert sorted(p.name for p in folder.iterdir()) == ["at-start.json", "server.log", "socket"]
    assert server._proc.stdin is not None
    server._proc.stdin.close()  # what the kernel does for a killed test process
    assert server._proc.wait(timeout=30) == 0
    assert not folder.exists()
    server.close()  # and the test process's own clean-up finds nothing left to do


# --- the projects' pytest, behind the tests' `python3` ------------------------------------------

PROBE = """import os

def test_probe():
    print(os.getpid(), os.getcwd(), os.environ.get("PROBE"), oct(os.umask(0o22)))
    assert os.environ.get("PROBE") != "fail"
"""


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A `python3` of this module's own, whose `-m pytest` a server of its own forks (whether
    or not the suite's are turned off)."""
    folder = tmp_path_factory.mktemp("shims")
    server = projects_pytest_server()
    write_interpreter(folder, server)
    yield folder
    server.close()


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str
    forked: bool  # the tests ran in a process other than the one started


def project_pytest(shims: Path, folder: Path, env: dict[str, str],
                   *args: str) -> Ran:
    """`python3 -m pytest` as the local backend runs it: the tests' `python3`, the variables it
    gives every command, standard input from /dev/null."""
    (folder / "test_probe.py").write_text(PROBE)
    proc = subprocess.Popen(
        [str(shims / "python3"), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         *args], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, env={"PATH": os.environ["PATH"], **COMMAND_ENV, **env})
    out, err = proc.communicate(timeout=120)
    return Ran(proc.returncode, out, err, out.split(" ", 1)[0] not in ("", str(proc.pid)))


def test_the_projects_pytest_is_forked_with_the_callers_directory_and_environment(
        shims: Path, tmp_path: Path) -> None:
    passed = project_pytest(shims, tmp_path, {"PROBE": "here"})
    assert passed.code == 0 and passed.err == "", passed.out + passed.err
    umask = oct(umask_of_this_process())
    assert passed.forked and f" {tmp_path} here {umask}" in passed.out
    assert "1 passed" in passed.out
    failed = project_pytest(shims, tmp_path, {"PROBE": "fail"})
    assert failed.code == 1 and failed.forked and "1 failed" in failed.out
    usage = project_pytest(shims, tmp_path, {}, "--no-such-option")
    assert usage.code == 4 and "--no-such-option" in usage.err


def test_a_variable_read_at_start_up_gets_the_projects_pytest_a_fresh_interpreter(
        shims: Path, tmp_path: Path) -> None:
    fresh = project_pytest(shims, tmp_path, {"PROBE": "here", "LC_ALL": "C"})
    assert fresh.code == 0 and not fresh.forked and f" {tmp_path} here" in fresh.out


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_caller_ends_the_forked_pytest_and_a_signal_ends_the_caller(
        shims: Path, tmp_path: Path, stop: signal.Signals) -> None:
    """The local backend ends a command past its time limit by killing its process group, and
    Ctrl-C interrupts it: the forked run must end with it, and the caller says nothing of it. A
    run that a signal ends ends its caller by that signal."""
    pid_file = tmp_path / "pid"
    (tmp_path / "test_sleep.py").write_text(
        "import os, time\n\ndef test_sleep():\n"
        f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    time.sleep(120)\n")
    caller = subprocess.Popen(
        [str(shims / "python3"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "test_sleep.py"], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={"PATH": os.environ["PATH"], **COMMAND_ENV},
        start_new_session=True)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and caller.poll() is None
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert pid != caller.pid  # the run is the server's child, not the caller
    os.killpg(caller.pid, stop)
    _, said = caller.communicate(timeout=30)
    assert caller.returncode == -stop and said == b""
    while _alive(pid):
        assert time.monotonic() < deadline, "the forked run outlived its caller"
        time.sleep(0.05)
    (tmp_path / "test_sleep.py").write_text(
        "import os, signal\n\ndef test_term():\n    os.kill(os.getpid(), signal.SIGTERM)\n")
    ended = subprocess.run(
        [str(shims / "python3"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "test_sleep.py"], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
        env={"PATH": os.environ["PATH"], **COMMAND_ENV}, timeout=120)
    assert ended.returncode == -signal.SIGTERM


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
