"""Shared fixtures: a sealed environment, real repositories, the real CLI, a fake model server."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import locale
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from retcon_sandbox.commands.demo import create
from retcon_sandbox.repo import demoproject as demo_project
from tests.forkserver import ForkServer

ROOT = Path(__file__).resolve().parent.parent
CLI = (sys.executable, "-m", "retcon_sandbox")
NEUTRAL = Path(tempfile.gettempdir())
SCRUB = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "RETCON_SANDBOX_MODEL", "GIT_DIR", "GIT_INDEX_FILE",
         "GIT_WORK_TREE", "XDG_STATE_HOME", "RETCON_SANDBOX_NOTES_KEY")


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Held by one test process at a time (test workers side by side wait their turn)."""
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def building_from_root() -> contextlib.AbstractContextManager[None]:
    """Held while a test builds a distribution from the checkout: setuptools works in ROOT/build,
    and two builds at once (test workers side by side) collide there ("File exists")."""
    return exclusive(NEUTRAL / "retcon-sandbox-tests-build.lock")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the CLIs the tests start, even when the suite itself was started in the
    background by a shell (`cmd &` without job control ignores SIGINT, and a child inherits an
    ignored signal: the Ctrl-C tests then wait for a process that never stops)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Modules whose tests take tens of seconds each (environments prepared through real registries,
# a Compose build, environments filled to their caps): they start first.
LONGEST = ("tests/docker/test_setup.py", "tests/docker/test_compose.py",
           "tests/docker/test_trust_env.py")


def _longest_first(item: pytest.Item) -> int:
    """The rank of a test's kind by how long such tests take: the longest modules, then the
    rest of the Docker tier, then whole runs on the local backend, then the fast tests. Started
    in that order (and with `--dist worksteal`), test workers never wait for a long test that
    started last: a worker whose own share is done takes the short tests left of another's."""
    if any(_path(item).endswith(module) for module in LONGEST):
        return 0
    if _in_docker_tier(item):
        return 1
    return 2 if item.get_closest_marker("slow") else 3


def _path(item: pytest.Item) -> str:
    return str(item.fspath).replace(os.sep, "/")


def _in_docker_tier(item: pytest.Item) -> bool:
    return "tests/docker/" in _path(item)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _in_docker_tier(item):
            item.add_marker(pytest.mark.docker)
    items.sort(key=_longest_first)  # stable: each kind keeps its modules' order


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made lives as long as the test process: frozen, it
    is never walked again by the collector (each full collection walked every object of
    openai, docker and the collected tests, over a second of CPU per test process)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def interpreter_bin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder whose `python3` and `python` are the interpreter running the tests, so commands
    run by the local backend use it (and its pytest) whether or not a venv is activated.

    Scripts, not symlinks: a symlink to a venv's python, outside the venv's folder, starts the
    base interpreter without the venv's packages (the venv is found beside the path run).
    The projects' tests need no pytest plugin, and loading every plugin of the development
    environment (xdist, anyio, ...) was 40 % of each of their runs' CPU. `python3 -m pytest`
    is forked from a server that imported pytest once (tests/forkserver.py), started with the
    variables the local backend gives every command (COMMAND_ENV)."""
    folder = tmp_path_factory.mktemp("bin")
    server = None
    if os.environ.get("RETCON_SANDBOX_TESTS_FORK") != "0":
        server = projects_pytest_server()
    write_interpreter(folder, server)
    yield folder
    if server is not None:
        server.close()


# What the helper gives every command besides PATH (sandbox/supervisor.py)
COMMAND_ENV = {name: value for name, value in importlib.import_module(
    "retcon_sandbox.sandbox.supervisor").COMMAND_ENV.items() if name != "PATH"}


def projects_pytest_server() -> ForkServer:
    """A server of `python3 -m pytest`, started with the variables the local backend gives
    every command: a run is forked whenever its own variables read at start-up match."""
    return ForkServer({"PATH": os.environ.get("PATH", ""), **COMMAND_ENV}, command="pytest")


def write_interpreter(folder: Path, server: ForkServer | None) -> None:
    """`folder`'s `python3` and `python`: this interpreter, without pytest's plugins; its
    `-m pytest` forked by `server`."""
    python = shlex.quote(sys.executable)
    forked = ("" if server is None else
              'if [ "$1" = -m ] && [ "$2" = pytest ]; then\n'
              f"  exec {python} -I -S {shlex.quote(str(ROOT / 'tests' / 'forkclient.py'))} "
              f'{shlex.quote(server.path)} {python} "$@"\nfi\n')
    for name in ("python3", "python"):
        shim = folder / name
        shim.write_text(f"#!/bin/sh\nexport PYTEST_DISABLE_PLUGIN_AUTOLOAD=1\n{forked}"
                        f'exec {python} "$@"\n')
        shim.chmod(0o755)


@pytest.fixture(autouse=True)
def sealed(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
           interpreter_bin: Path) -> Path:
    """HOME, git config and commit dates are ours; no model settings leak in from the host;
    `python3` is the interpreter running the tests."""
    monkeypatch.setenv("PATH", f"{interpreter_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    home = tmp_path_factory.mktemp("home")
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Test Author\n\temail = author@example.com\n"
        "[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
    monkeypatch.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
    monkeypatch.setenv("RETCON_SANDBOX_MODEL_MAX_WAIT", "0.01")
    for name in SCRUB:
        monkeypatch.delenv(name, raising=False)
    return home


def git(repo: Path, *args: str) -> str:
    """The real git CLI, for assertions independent of our adapter."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@dataclass
class Demo:
    path: Path
    spec: Path

    def git(self, *args: str) -> str:
        return git(self.path, *args)


_TEMPLATES: dict[tuple[str, ...], Path] = {}  # the demo repository made once per identity


def make_demo(directory: Path, with_paths: bool, spec_text: str | None = None) -> Demo:
    """The demo's messy repository (10 commits, interleaved concerns) and a 4-commit spec.

    `retcon-sandbox demo`'s own `create` makes it once per test process and git identity (the
    sealed dates and author make it the same repository every time), and each test gets a copy:
    ten commits through git cost seconds on a loaded machine, a copy a tenth of that."""
    key = (*(os.environ.get(name, "") for name in IDENTITY), _global_config())
    template = _TEMPLATES.get(key)
    if template is None or not template.is_dir():
        template = Path(tempfile.mkdtemp(prefix="retcon-demo-template-")) / "repo"
        create(template, with_paths).unlink()  # the spec: each copy writes its own
        _TEMPLATES[key] = template
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} is not empty")
    shutil.copytree(template, directory, symlinks=True, dirs_exist_ok=True)
    git(directory, "update-index", "-q", "--refresh")  # the index's stat data, as checked out
    spec = directory / SPEC_NAME  # where `create` writes it
    spec.write_text(spec_text or demo_project.spec_text(with_paths), encoding="utf-8")
    return Demo(directory, spec)


IDENTITY = ("GIT_CONFIG_NOSYSTEM", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
            "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE")
SPEC_NAME = "history-spec.toml"


def _global_config() -> str:
    path = os.environ.get("GIT_CONFIG_GLOBAL") or os.path.expanduser("~/.gitconfig")
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


@pytest.fixture(scope="session", autouse=True)
def _remove_demo_templates() -> Iterator[None]:
    yield
    for template in _TEMPLATES.values():
        shutil.rmtree(template.parent, ignore_errors=True)


@pytest.fixture
def demo(tmp_path: Path) -> Demo:
    return make_demo(tmp_path / "repo", with_paths=True)


@dataclass
class Result:
    code: int
    out: str
    err: str


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 600) -> Result:
    """The real command line, in a process of its own; by default from a directory outside any
    repository, so the repository is found from the spec's directory.

    The process is forked from one that imported the command line's modules once
    (`tests/forkserver.py`): what a fresh `python -m retcon_sandbox` is once its imports are
    done, without their 0.2 to 1 s of CPU each time. A command whose environment changes what
    is read at start-up (`PYTHONIOENCODING`, the locale), a command the server does not take,
    or any command when RETCON_SANDBOX_TESTS_FORK=0, starts a fresh interpreter."""
    merged = {**os.environ, **(env or {})}
    server = _fork_server()
    done = server.run(list(args), cwd or NEUTRAL, merged, timeout) if server else None
    if done is not None:
        code, out, err = done
        return Result(code, _text(out), _text(err))
    proc = subprocess.run([*CLI, *args], cwd=cwd or NEUTRAL, capture_output=True, text=True,
                          env=merged, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _text(data: bytes) -> str:
    """As `subprocess.run(text=True)` decodes: the locale's encoding, universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


_SERVER: list[ForkServer] = []  # this test process's, started at its first command
_SERVER_ENV = dict(os.environ)  # as the test process started, before any test changed it
_SERVER_LOCK = threading.Lock()


def _fork_server() -> ForkServer | None:
    if os.environ.get("RETCON_SANDBOX_TESTS_FORK") == "0":
        return None
    with _SERVER_LOCK:
        if not _SERVER:
            _SERVER.append(ForkServer(_SERVER_ENV))
        return _SERVER[0]


@pytest.fixture(scope="session", autouse=True)
def _stop_fork_server() -> Iterator[None]:
    yield
    for server in _SERVER:
        server.close()


def cli_at_terminal(*args: str, typed: bytes, env: dict[str, str] | None = None,
                    timeout: float = 120) -> Result:
    """The real command line with a terminal as its standard input, on which `typed` is
    written at once (an answer to a prompt it will show)."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([*CLI, *args], cwd=NEUTRAL, stdin=follower,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        os.close(follower)
        os.write(leader, typed)
        out, err = proc.communicate(timeout=timeout)
    finally:
        os.close(leader)
    return Result(proc.returncode, out, err)


def cli_on_a_terminal(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                      timeout: float = 60) -> Result:
    """The real command line with a pseudo-terminal as its standard output (all it wrote, as
    text, in `out`); standard input and error are not a terminal."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CLI, *args], cwd=cwd or NEUTRAL, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return Result(proc.wait(timeout=timeout), out.decode(), "")


def llm_env(base_url: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "test-key",
            "RETCON_SANDBOX_MODEL": "fake-model"}
