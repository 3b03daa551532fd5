"""What honest git metadata costs: the workspace's repository with the tag `distance` commits
under the tree's commit (one `git fast-import` of a synthetic history), side by side with the
one-commit repository tagged on the tree itself (distance 0, what 0.3.0 made).

    python3 bench/git_metadata.py [--files 2000] [--repeat 3]

Runs the supervisor's `make_git` with the host's git on a workspace of FILES small files (the same
code runs in the sandbox, with the image's git). Prints the median seconds per distance and
what `git describe --tags --long` says. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")


def once(root: Path, distance: int) -> tuple[float, str]:
    shutil.rmtree(root / ".git", ignore_errors=True)
    started = time.monotonic()
    assert supervisor.make_git(str(root), "v1.0", distance) == 0
    seconds = time.monotonic() - started
    described = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--long"],
                               capture_output=True, text=True, check=True).stdout.strip()
    return seconds, described


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"| distance | seconds (median of {args.repeat}) | git describe --tags --long |")
    print("|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="retcon-bench-git-") as tmp:
        root = Path(tmp)
        for n in range(args.files):
            (root / f"d{n % 20}").mkdir(exist_ok=True)
            (root / f"d{n % 20}" / f"f{n}.py").write_text(f"x = {n}\n")
        for distance in (0, 1, 100, 1000, 10000):
            runs = [once(root, distance) for _ in range(args.repeat)]
            label = f"{distance} (one commit, 0.3.0)" if distance == 0 else str(distance)
            print(f"| {label} | {statistics.median(s for s, _ in runs):.2f} | "
                  f"{runs[-1][1][:-7]}<hash> |")


if __name__ == "__main__":
    main()
