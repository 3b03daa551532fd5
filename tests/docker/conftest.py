"""The Docker tier: a real engine, our real images. It fails (never skips) if no engine answers."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from testcontainers.core.container import DockerContainer

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import LABEL_RUN, LABEL_SPEC, DockerEngine
from retcon_sandbox.spec.settings import DEFAULTS


def say(line: str) -> None:
    sys.stderr.write(line + "\n")


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    engine = DockerEngine()  # raises SandboxError, failing the tier, when no engine answers
    sandboximages.ensure(engine, sandboximages.default_image(), say)
    return engine


def ours(engine: DockerEngine, base: Path) -> list[str]:
    """Sandbox containers of this test session: their spec lives under its base directory (so
    sessions running side by side on one engine do not count each other's)."""
    found = engine.client.containers.list(all=True, ignore_removed=True,
                                          filters={"label": LABEL_RUN})
    return [str(c.id) for c in found if c.labels.get(LABEL_SPEC, "").startswith(str(base))]


def commit_sandbox(engine: DockerEngine, base: Path, proc: subprocess.Popen[str]) -> str:
    """The first commit's sandbox (labelled `commit-1`) of the run `proc` whose spec is under
    `base`, once it exists: not the short-lived preflight one, which checks the commands before
    anything is written, nor the next commit's, which the look-ahead opens beside it."""
    def commit_boxes() -> list[str]:
        found = engine.client.containers.list(all=True, ignore_removed=True,
                                              filters={"label": LABEL_RUN})
        mine = set(ours(engine, base))
        return [str(c.id) for c in found if str(c.id) in mine
                and c.labels.get("retcon-sandbox.step") == "commit-1"]
    deadline = time.monotonic() + 120
    while not commit_boxes() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    found = commit_boxes()
    assert len(found) == 1
    return found[0]


def wait_for_process(engine: DockerEngine, container_id: str, command: str,
                     proc: subprocess.Popen[str]) -> None:
    """Until `command` runs in the container (the run `proc` is inside that step by then)."""
    def running() -> bool:
        try:
            top = engine.client.containers.get(container_id).top()
        except Exception:  # not started yet, or already gone: proc.poll() tells which
            return False
        return any(command in " ".join(row) for row in top.get("Processes") or [])
    deadline = time.monotonic() + 120
    while not running() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    assert running(), f"{command!r} never ran in the sandbox"


@pytest.fixture(autouse=True)
def no_container_left(engine: DockerEngine,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After every Docker test: no sandbox container of ours may remain, on any exit path."""
    yield
    base = tmp_path_factory.getbasetemp()
    left = ours(engine, base)
    for container_id in left:
        engine.client.containers.get(container_id).remove(force=True, v=True)
    networks = [n for n, labels in engine.sandbox_networks().items()
                if labels.get(LABEL_SPEC, "").startswith(str(base))]
    for network_id in networks:
        engine.remove_network(network_id)
    assert not left, f"{len(left)} sandbox container(s) left behind"
    assert not networks, f"{len(networks)} setup network(s) left behind"


@contextlib.contextmanager
def leftover(engine: DockerEngine, labels: dict[str, str]) -> Iterator[str]:
    """A plain container of our image, started with testcontainers, whose labels make it look
    like what a killed run leaves behind: its id. The code under test is meant to remove it; if
    it did not, it goes at the end."""
    container = DockerContainer(sandboximages.default_image(), command="sleep infinity",
                                labels=labels)
    container.start()
    container_id = str(container.get_wrapped_container().id)
    try:
        yield container_id
    finally:
        if container_id in engine.sandbox_containers():
            container.stop()
        else:
            container.get_docker_client().client.close()


SMALL = DEFAULTS.replace(memory="256m", cpus=1.0, pids=128, workspace_size="64m",
                         tmp_size="32m")


@pytest.fixture
def backend(engine: DockerEngine, tmp_path: Path) -> DockerBackend:
    return DockerBackend(engine, sandboximages.default_image(), SMALL, {}, tmp_path / "spec.toml")


def build_test_image(engine: DockerEngine, tag: str, dockerfile: str) -> None:
    """An image of a test's own, from a Dockerfile's text."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    engine.build(buffer, tag, {}, {}, lambda line: None)
