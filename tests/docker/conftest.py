"""The Docker tier: a real engine, our real images. It fails (never skips) if no engine answers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import images
from runner.docker_backend import LABEL_RUN, DockerBackend, DockerEngine, Hardening


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    engine = DockerEngine()  # raises SandboxError, failing the tier, when no engine answers
    images.ensure(engine, images.DEFAULT_IMAGE, lambda line: sys.stderr.write(line + "\n"))
    return engine


@pytest.fixture(autouse=True)
def no_container_left(engine: DockerEngine) -> Iterator[None]:
    """After every Docker test: no sandbox container may remain, on any exit path."""
    yield
    left = engine.count_containers(LABEL_RUN)
    engine.remove_containers([LABEL_RUN])
    assert left == 0, f"{left} sandbox container(s) left behind"


SMALL = Hardening(memory="256m", cpus=1.0, pids=128, workspace_size="64m", tmp_size="32m")


@pytest.fixture
def backend(engine: DockerEngine, tmp_path: Path) -> DockerBackend:
    return DockerBackend(engine, images.DEFAULT_IMAGE, SMALL, {}, tmp_path / "spec.toml")
