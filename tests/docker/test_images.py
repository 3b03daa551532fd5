"""The images themselves, checked in a plain container started with testcontainers."""

from __future__ import annotations

import pytest
from testcontainers.core.container import DockerContainer

from retcon_sandbox.backends import images
from retcon_sandbox.backends.docker.engine import DockerEngine, engine_version


@pytest.mark.parametrize(("name", "checks"), [
    ("base", ["python3 --version", "python3 -m pytest --version", "git --version",
              "gcc --version", "make --version", "id -u sandbox"]),
    ("node", ["node --version", "python3 --version"]),
])
def test_images_carry_their_toolchains(engine: DockerEngine, name: str,
                                       checks: list[str]) -> None:
    tag = images.CATALOG[name].tag
    images.ensure(engine, tag, lambda line: None)
    with DockerContainer(tag).with_command("sleep infinity") as container:
        for check in checks:
            code, output = container.exec(["sh", "-c", check])
            assert code == 0, f"{name}: {check}: {output!r}"


def test_the_crash_log_names_the_engine_version(engine: DockerEngine) -> None:
    info = engine.client.version()
    assert engine_version() == (f"{info['Version']} (API {info['ApiVersion']}, {info['Os']}/"
                                f"{info['Arch']})")
