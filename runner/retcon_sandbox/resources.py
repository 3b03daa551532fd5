"""Files shipped inside the package: the prompts, the in-container helper and the Dockerfiles.

They are read through importlib.resources, so an installed wheel behaves exactly like a checkout.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from string import Template


def prompt_text(name: str) -> str:
    return (files("retcon_sandbox.model") / "prompts" / f"{name}.md").read_text(encoding="utf-8")


def prompt(name: str, **values: object) -> str:
    """A prompt file with `$name` placeholders filled in."""
    return Template(prompt_text(name)).safe_substitute({k: str(v) for k, v in values.items()})


# The helper's import of the protocol module it shares with the host (see protocol.py).
_SHARED = re.compile(r"^from retcon_sandbox\.protocol import \([^)]*\)\n", re.MULTILINE)


@cache  # read once per process (the helper is sent with every exec)
def helper_source() -> str:
    """The helper as one self-contained file: the protocol module's text in place of the
    helper's import of it."""
    helper = (files("retcon_sandbox.sandbox") / "helper.py").read_text(encoding="utf-8")
    shared = (files("retcon_sandbox") / "protocol.py").read_text(encoding="utf-8")
    shared = shared.replace("from __future__ import annotations\n", "", 1)
    source, count = _SHARED.subn(lambda _: shared, helper, count=1)
    if count != 1:
        raise RuntimeError("sandbox/helper.py no longer imports retcon_sandbox.protocol")
    return source


@cache  # read once per process (the helper is sent with every exec)
def egress_source() -> str:
    return (files("retcon_sandbox.sandbox") / "egress.py").read_text(encoding="utf-8")


def dockerfiles() -> Traversable:
    """The folder of image build contexts: one sub-folder with a Dockerfile per image."""
    return files("retcon_sandbox.dockerfiles")
