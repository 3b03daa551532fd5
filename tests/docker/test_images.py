"""The images themselves, checked in a plain container started with testcontainers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from testcontainers.core.container import DockerContainer

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine, engine_version

# Slim as debian:bookworm-slim, bootstrapped or not: no document, manual page or translation
# files, in the root filesystem or from what the Dockerfiles install (node's nodejs; dpkg
# still makes a package's links there, as in debian:bookworm-slim).
SLIM = ("! find /usr/share/doc /usr/share/man /usr/share/locale /usr/share/info -type f "
        "! -name copyright ! -name locale.alias | grep .")


@pytest.mark.parametrize(("name", "checks"), [
    ("base", ["python3 --version", "python3 -m pytest --version", "git --version",
              "gcc --version", "make --version", "id -u sandbox", SLIM,
              "test -f /usr/share/doc/git/copyright"]),
    ("node", ["node --version", "python3 --version", SLIM]),
])
def test_images_carry_their_toolchains(engine: DockerEngine, name: str,
                                       checks: list[str]) -> None:
    tag = sandboximages.CATALOG[name].tag
    sandboximages.ensure(engine, tag, lambda line: None)
    with DockerContainer(tag).with_command("sleep infinity") as container:
        for check in checks:
            code, output = container.exec(["sh", "-c", check])
            assert code == 0, f"{name}: {check}: {output!r}"


def test_the_crash_log_names_the_engine_version(engine: DockerEngine) -> None:
    info = engine.client.version()
    assert engine_version() == (f"{info['Version']} (API {info['ApiVersion']}, {info['Os']}/"
                                f"{info['Arch']})")


def test_a_second_build_of_an_image_waits_for_the_first(engine: DockerEngine, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes (or two test workers) on a fresh machine build an image once: the second
    waits for the first's lock, then finds the image there."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    tag = sandboximages.default_image()
    said: list[str] = []
    order: list[str] = []
    entered = threading.Event()

    def second() -> None:
        entered.wait(30)
        with sandboximages.building(engine, tag, said.append):
            order.append("second")

    waiter = threading.Thread(target=second)
    waiter.start()
    with sandboximages.building(engine, tag, said.append):
        entered.set()
        while not said and waiter.is_alive():
            time.sleep(0.05)
        order.append("first")
    waiter.join(30)
    assert order == ["first", "second"]
    assert said == [f"Waiting for another process building {tag}..."]
    assert list((tmp_path / "retcon-sandbox" / "locks").iterdir())
