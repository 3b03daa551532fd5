"""Files shipped inside the package: the prompts, the in-container helper and the Dockerfiles.

They are read through importlib.resources, so an installed wheel behaves exactly like a checkout.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from string import Template


def prompt_text(name: str) -> str:
    return (files("retcon_sandbox.model") / "prompts" / f"{name}.md").read_text(encoding="utf-8")


def prompt(name: str, **values: object) -> str:
    """A prompt file with `$name` placeholders filled in."""
    return Template(prompt_text(name)).safe_substitute({k: str(v) for k, v in values.items()})


@cache  # read once per process (the helper is sent with every exec)
def helper_source() -> str:
    return (files("retcon_sandbox.sandbox") / "helper.py").read_text(encoding="utf-8")


@cache  # read once per process (the helper is sent with every exec)
def egress_source() -> str:
    return (files("retcon_sandbox.sandbox") / "egress.py").read_text(encoding="utf-8")


def dockerfiles() -> Traversable:
    """The folder of image build contexts: one sub-folder with a Dockerfile per image."""
    return files("retcon_sandbox.dockerfiles")
