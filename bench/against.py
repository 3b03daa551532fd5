"""Another checkout's code, to run beside this one's (`--against` in bench/floor.py and
bench/redo.py): a copy of its packages laid out as an install lays them out, so that its own
helper, supervisor and Dockerfiles come with it (an editable install of this checkout would
otherwise supply them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUT = (("runner/retcon_sandbox", "retcon_sandbox"), ("sandbox", "retcon_sandbox/sandbox"),
          ("images", "retcon_sandbox/dockerfiles"))


def python_path(checkout: Path) -> Path:
    """A directory to put first on PYTHONPATH to run `checkout`'s code."""
    root = Path(tempfile.mkdtemp(prefix="retcon-bench-against-"))
    for source, target in LAYOUT:
        shutil.copytree(checkout / source, root / target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


COMPILE = ("import compileall, os, retcon_sandbox; "
           "compileall.compile_dir(os.path.dirname(retcon_sandbox.__file__), quiet=2)")


def as_installed(env: dict[str, str]) -> dict[str, str]:
    """`env` for the tool's processes as an install runs them: its modules' bytecode compiled
    beforehand, as pip compiles them when it installs (written beside them, in `__pycache__`).
    A machine with PYTHONDONTWRITEBYTECODE set compiles every module at every start instead:
    0.2 to 0.3 s of CPU and wall time per process, which no user of an install pays. (Not
    PYTHONPYCACHEPREFIX: it would hide the bytecode every installed library already has.)"""
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", COMPILE], env=out, check=True)
    return out
