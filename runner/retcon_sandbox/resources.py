"""Files shipped inside the package: the prompts, the in-container helper and the Dockerfiles.

They are read through importlib.resources, so an installed wheel behaves exactly like a checkout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from string import Template


def prompt_text(name: str) -> str:
    return (files("retcon_sandbox.model") / "prompts" / f"{name}.md").read_text(encoding="utf-8")


def prompt(name: str, **values: object) -> str:
    """A prompt file with `$name` placeholders filled in."""
    return Template(prompt_text(name)).safe_substitute({k: str(v) for k, v in values.items()})


# The helper's imports of the modules it shares: with the host (see protocol.py), and with the
# supervised modes' exec (sandbox/supervisor.py).
_SHARED = {("retcon_sandbox", "protocol.py"): re.compile(
               r"^from retcon_sandbox\.protocol import \([^)]*\)\n", re.MULTILINE),
           ("retcon_sandbox.sandbox", "supervisor.py"): re.compile(
               r"^from retcon_sandbox\.sandbox\.supervisor import \([^)]*\)\n", re.MULTILINE)}
_MAIN = '\nif __name__ == "__main__":\n'


@cache  # read once per process (the helper is sent with every exec)
def helper_source() -> str:
    """The helper as one self-contained file: each shared module's text (without its
    `__main__` block) in place of the helper's import of it."""
    source = (files("retcon_sandbox.sandbox") / "helper.py").read_text(encoding="utf-8")
    for (package, name), imported in _SHARED.items():
        shared = (files(package) / name).read_text(encoding="utf-8")
        shared = shared.replace("from __future__ import annotations\n", "", 1)
        shared = shared.split(_MAIN, 1)[0] + "\n"
        source, count = imported.subn(_constant(shared), source, count=1)
        if count != 1:
            raise RuntimeError(f"sandbox/helper.py no longer imports {package}.{name[:-3]}")
    return source


def _constant(text: str) -> Callable[[re.Match[str]], str]:
    return lambda _: text  # a replacement taken as it is (no backslash escapes)


@cache  # read once per process (sent with every build and test command's exec)
def supervisor_source() -> str:
    return (files("retcon_sandbox.sandbox") / "supervisor.py").read_text(encoding="utf-8")


@cache  # read once per process (the helper is sent with every exec)
def egress_source() -> str:
    return (files("retcon_sandbox.sandbox") / "egress.py").read_text(encoding="utf-8")


@cache  # read once per process (the first process of every container)
def keeper_source() -> str:
    return (files("retcon_sandbox.sandbox") / "keeper.py").read_text(encoding="utf-8")


def dockerfiles() -> Traversable:
    """The folder of image build contexts: one sub-folder with a Dockerfile per image."""
    return files("retcon_sandbox.dockerfiles")
