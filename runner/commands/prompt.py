"""`retcon-sandbox prompt`: guidance for writing a spec, for a person or an agent."""

from __future__ import annotations

from runner.agent import PROMPTS
from runner.errors import EXIT_OK


def run() -> int:
    print((PROMPTS / "guide.md").read_text(encoding="utf-8"), end="")
    return EXIT_OK
