"""Another checkout's code, to run beside this one's (`--against` in bench/floor.py and
bench/redo.py): a copy of its packages laid out as an install lays them out, so that its own
helper, supervisor and Dockerfiles come with it (an editable install of this checkout would
otherwise supply them)."""

from __future__ import annotations

import shutil
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
