"""`retcon-sandbox clean`: remove every sandbox container left behind (e.g. after kill -9)."""

from __future__ import annotations

from runner.docker_backend import LABEL_RUN, DockerEngine
from runner.errors import EXIT_OK


def run() -> int:
    count = DockerEngine().remove_containers([LABEL_RUN])
    print(f"Removed {count} sandbox container(s)." if count else "No sandbox containers left.")
    return EXIT_OK
