"""A real Podman, through its Docker-compatible API (`podman system service` on a socket of
this test's own): refused by name, before anything is written, with what to use instead. The
test skips where Podman is not installed, except in CI, where .ci/run installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Demo, cli


@pytest.fixture
def podman_socket(tmp_path: Path) -> Iterator[str]:
    podman = shutil.which("podman")
    if podman is None:
        if os.environ.get("CI"):
            pytest.fail("podman is not installed: CI must install it")
        pytest.skip("podman is not installed")
    sock = tmp_path / "podman.sock"
    log = tmp_path / "podman.log"
    service = subprocess.Popen([podman, "system", "service", "--time=0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if service.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"podman's API service did not start: {log.read_text()}")
            time.sleep(0.1)
        yield f"unix://{sock}"
    finally:
        service.terminate()
        service.wait(timeout=30)


def test_a_real_podman_is_refused_by_name(podman_socket: str, demo: Demo) -> None:
    before = demo.spec.read_text()
    result = cli("execute", str(demo.spec), "--non-interactive",
                 env={"DOCKER_HOST": podman_socket})
    assert result.code == 1, result.out + result.err
    assert f"the engine at {podman_socket} (DOCKER_HOST) is Podman (" in result.err
    assert "tmpfs `uid=`" in result.err and "Use a Docker engine" in result.err
    assert demo.spec.read_text() == before
    assert "feature-clean" not in demo.git("branch", "--list")
