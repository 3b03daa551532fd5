"""`retcon-sandbox prompt`: guidance for writing a spec, for a person or an agent."""

from __future__ import annotations

import argparse

from retcon_sandbox.errors import EXIT_OK
from retcon_sandbox.resources import prompt_text


def run(args: argparse.Namespace) -> int:
    print(prompt_text("guide"), end="")
    return EXIT_OK
