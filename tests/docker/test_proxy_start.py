"""The egress proxy's start on a busy machine: its deadline is stretched by the load, and a
proxy that did not say it listens is told apart from one that stopped, each with what it wrote
(it used to end runs with "did not start: " and nothing after the colon, and "rebuild the
image" either way)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from retcon_sandbox import deadlines
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import LABEL_RUN, LABEL_SPEC
from retcon_sandbox.backends.docker.sandboxes import _wait_listening
from retcon_sandbox.errors import SandboxError
from retcon_sandbox.resources import keeper_source


@contextmanager
def proxy_running(backend: DockerBackend, script: str) -> Iterator[str]:
    """A container as the egress proxy's is made (the keeper, with `script` as its command)
    whose command is not the proxy."""
    engine = backend.engine
    container = engine.create_container(dict(
        image=sandboximages.default_image(), entrypoint=["/usr/bin/python3"],
        command=["-I", "-S", "-c", keeper_source(), "120", "0", "/bin/sh", "-c", script],
        stdin_open=True, detach=False, auto_remove=True, network_mode="none",
        labels={LABEL_RUN: backend.run_id, LABEL_SPEC: backend.spec_path}))
    try:
        backend.leases.hold(container)
        engine.start_container(container)
        yield container
    finally:
        backend.discard(container)


def test_a_proxy_that_does_not_listen_in_time_says_so_with_the_load(backend: DockerBackend
                                                                    ) -> None:
    with proxy_running(backend, "sleep 300") as proxy, \
            pytest.raises(SandboxError) as caught:
        _wait_listening(backend.engine, proxy, ready_s=0.5)
    assert "did not say it was listening within" in caught.value.message
    assert caught.value.message.endswith(": it wrote nothing")
    assert "this machine's load is" in caught.value.message
    assert "Rebuild" not in caught.value.hint and "less loaded" in caught.value.hint


def test_a_proxy_that_stopped_says_what_it_wrote(backend: DockerBackend) -> None:
    with proxy_running(backend, "echo 'cannot bind' >&2; exit 3") as proxy, \
            pytest.raises(SandboxError) as caught:
        _wait_listening(backend.engine, proxy, ready_s=60)
    assert caught.value.message.startswith("the setup's egress proxy stopped before it "
                                           "listened: cannot bind\n")
    assert "the command ended (exit 3)" in caught.value.message
    assert "Rebuild our base image" in caught.value.hint


def test_the_start_deadline_stretches_with_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = 2
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    for load, seconds in ((0.5, 20.0), (2.0, 20.0), (30.0, 300.0), (500.0, 300.0)):
        monkeypatch.setattr("os.getloadavg", lambda load=load: (load, load, load))
        assert deadlines.stretched(20.0) == seconds
