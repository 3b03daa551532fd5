"""`retcon-sandbox images build|bootstrap|list`."""

from __future__ import annotations

import sys

from runner import images
from runner.docker_backend import DockerEngine
from runner.errors import EXIT_OK


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


def build(names: list[str]) -> int:
    engine = DockerEngine()
    for name in names or list(images.CATALOG):
        tag = images.build(engine, name, _say)
        print(f"Built {tag}")
    return EXIT_OK


def bootstrap() -> int:
    tag = images.bootstrap(DockerEngine(), _say)
    print(f"Bootstrapped {tag}; `retcon-sandbox images build` now builds offline.")
    return EXIT_OK


def listing() -> int:
    engine = DockerEngine()
    for definition in images.CATALOG.values():
        state = "built" if engine.has_image(definition.tag) else "not built"
        print(f"  {definition.name:<6} {definition.tag:<28} {state}")
    return EXIT_OK
