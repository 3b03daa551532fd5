"""Hostile code in the sandbox: each case is contained, and the sandbox, the host, the repository
and later commits are unharmed. (`no_container_left` checks cleanup after every test.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.backends.api import HelperSandbox, ToolFailure
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import SandboxError
from retcon_sandbox.repo.gitrepo import Repo


def still_serving(box: HelperSandbox) -> None:
    result = box.run("echo alive", 10)
    assert result.passed and result.output == "alive\n"


def test_the_sandbox_is_isolated(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        info = box.hello()
        assert info.uid == 10001 and info.problems == []
        result = box.run("id -u; cat /proc/self/status | grep -E '^(CapEff|NoNewPrivs)'; "
                         "ls /sys/class/net; test -S /var/run/docker.sock && echo SOCKET", 10)
        assert result.output.split() == ["10002", "CapEff:", "0000000000000000",
                                         "NoNewPrivs:", "1", "lo"]


def test_a_sandbox_that_is_not_isolated_is_refused(backend: DockerBackend) -> None:
    class WithNetwork(DockerBackend):
        def create_kwargs(self, label: str, image: str | None = None, lifetime: float = 0.0
                          ) -> dict[str, Any]:
            return {**super().create_kwargs(label, image, lifetime), "network_mode": "bridge"}

    leaky = WithNetwork(backend.engine, backend.image, backend.settings, {},
                        Path(backend.spec_path))
    with pytest.raises(SandboxError, match="network interfaces besides loopback"), \
            leaky.open("t"):
        pass


def test_a_build_that_tries_to_reach_the_network(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), "
                         "timeout=3)\"; getent hosts deb.debian.org || echo NO-DNS", 30)
        assert "Network is unreachable" in result.output and "NO-DNS" in result.output
        still_serving(box)


def test_a_fork_bomb(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("bomb() { bomb | bomb & }; bomb; sleep 30", 5)
        assert not result.passed and "fork" in result.output.lower()  # the pids limit held
        alive = box.run("ls /proc | grep -c '^[0-9]'", 10)
        assert int(alive.output) < 10, alive.output  # init, keeper, helper, this shell
        still_serving(box)


def test_an_output_flood(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("yes 'flood flood flood'", 3)
        assert result.timed_out and result.truncated and result.total_bytes > 1_000_000
        assert len(result.output) < 100_000
        still_serving(box)


def test_a_command_that_never_ends(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("trap '' TERM INT; while :; do sleep 1; done", 2)
        assert result.timed_out and result.seconds < 10
        assert box.run("ps -eo comm= 2>/dev/null | grep -c sleep || true", 10).output.strip() \
            in ("0", "")
        still_serving(box)


def test_a_memory_hog(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("python3 -c \"b = b'x' * (2 * 1024**3)\"", 60)
        assert not result.passed and result.exit_code in (137, -9, 1)
        still_serving(box)


def test_a_disk_filler(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("dd if=/dev/zero of=big bs=1M count=500; dd if=/dev/zero of=/tmp/big "
                         "bs=1M count=500; touch /usr/evil /evil", 60)
        assert "No space left on device" in result.output
        assert "Read-only file system" in result.output
        assert not result.passed
        still_serving(box)


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "a/../../etc/passwd"])
def test_tool_calls_with_escaping_paths(backend: DockerBackend, path: str) -> None:
    with backend.open("t") as box:
        with pytest.raises(ToolFailure):
            box.write_file(path, b"x")
        with pytest.raises(ToolFailure):
            box.read_file(path)
        still_serving(box)


def test_a_symlink_out_of_the_workspace_in_the_repository(tmp_path: Path,
                                                          backend: DockerBackend) -> None:
    repo = Repo.init(tmp_path / "repo")
    repo.commit_files("main", {"README.md": "hi\n"}, "init")
    tree = repo.make_tree(repo.tree_of("main"), [])
    link_blob = repo.write_blob(b"/etc")
    from retcon_sandbox.repo.gitrepo import FileChange, TreeEntry

    tree = repo.make_tree(tree, [FileChange("escape", TreeEntry("120000", link_blob))])
    with backend.open("t") as box:
        box.load_tree(repo.tree_tar(tree, 1 << 20))
        state = WorkState(repo, lambda _: box, tree, repo.resolve("main"), 1 << 20)
        with pytest.raises(ToolFailure, match="outside the workspace"):
            state.read_file("escape/passwd", None, None)
        with pytest.raises(ToolFailure, match="symlink"):
            state.write_file("escape/cron", "x")
        with pytest.raises(ToolFailure, match="symlink"):
            state.delete_file("escape")
        assert state.changes() == []
        still_serving(box)


def test_the_build_environment_has_no_secrets(engine: DockerEngine, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    monkeypatch.setenv("SOME_HOST_VAR", "host-only")
    from retcon_sandbox.backends.docker import sandboximages
    from tests.docker.conftest import SMALL

    backend = DockerBackend(engine, sandboximages.default_image(), SMALL, {"LANG": "C.UTF-8"},
                            tmp_path / "spec.toml")
    with backend.open("t") as box:
        output = box.run("env; cat /proc/1/environ | tr '\\0' '\\n'", 10).output
    assert "sk-secret-value" not in output and "OPENAI" not in output
    assert "host-only" not in output and os.environ["HOME"] not in output


def test_an_image_without_python3_is_refused_with_the_requirement(
        engine: DockerEngine, tmp_path: Path) -> None:
    from retcon_sandbox.backends.docker import sandboximages
    from tests.docker.conftest import SMALL, build_test_image

    build_test_image(engine, "retcon-sandbox-test/nopython:latest",
                     f"FROM {sandboximages.default_image()}\nUSER root\n"
                     "RUN rm -f /usr/bin/python3*\n")

    backend = DockerBackend(engine, "retcon-sandbox-test/nopython:latest", SMALL, {},
                            tmp_path / "spec.toml")
    try:
        requirement = r"has no /usr/local/bin/python3 or /usr/bin/python3 \(or no /bin/sh\)"
        with pytest.raises(SandboxError, match=requirement), backend.open("t"):
            pass
    finally:
        engine.client.images.remove("retcon-sandbox-test/nopython:latest", force=True)


def test_copy_out_of_what_a_build_left(tmp_path: Path, backend: DockerBackend) -> None:
    """A build leaves a symlink out of the workspace, a FIFO, a `.git` with hooks, a file over
    the limit: copy-out takes the link as a link, never opens the FIFO, leaves `.git` out, and
    refuses the large file by name; nothing is written on the host but git objects."""
    from retcon_sandbox.backends.workspace import copy_out, sandbox_tree

    repo = Repo.init(tmp_path / "repo")
    outside = sorted(p.relative_to(repo.root) for p in repo.root.rglob("*")
                     if "objects" not in p.parts)
    with backend.open("t") as box:
        assert box.run("mkdir -p src .git/hooks && echo ok > src/a.py && ln -s /etc escape "
                       "&& mkfifo pipe && echo evil > .git/hooks/post-commit "
                       "&& head -c 3000 /dev/zero > big.bin", 30).passed
        with pytest.raises(SandboxError, match=r"big\.bin is 2\.9 KB, over the largest file"):
            sandbox_tree(box, repo, 2000)
        still_serving(box)
        entries = copy_out(box, repo, 4000)
        assert sorted(entries) == ["big.bin", "escape", "src/a.py"]
        assert entries["escape"].mode == "120000" and repo.blob(entries["escape"].sha) == b"/etc"
        assert repo.blob(entries["src/a.py"].sha) == b"ok\n"
        still_serving(box)
    assert sorted(p.relative_to(repo.root) for p in repo.root.rglob("*")
                  if "objects" not in p.parts) == outside
