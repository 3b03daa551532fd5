"""A redo whose every tree is cached: its wall time and where it goes, beside another checkout's.

    python3 bench/redo.py [--runs 5] [--against /path/to/another/checkout]

Makes the demo (4 `paths` commits), reconstructs it once with Docker (filling the verification
cache), then redoes it RUNS times (cleaned branch and history entries deleted: every tree is
cached) and prints the median of each part of a redo, read from the run's own `--json` events
and the clock around the process:
- start-up: from the process's start to the first event (`spec`): the interpreter, imports,
  the spec's and the repository's checks, the engine's connection and the image;
- preflight: from `spec` to `branch_created` (a sandbox for the base's tree, unless a stamp says
  the check passed before; 0.3.0 also built and tested the base there, from the cache);
- commits: from `branch_created` to `summary` (taking the paths, making the commits, the cached
  verdicts);
- shut-down: from `summary` to the process's exit;
and the CPU seconds the redo used (its own and its children's: git). The modules' bytecode is
kept, as in an install (bench/against.py's `as_installed`), even where PYTHONDONTWRITEBYTECODE is
set. With `--against`, the same
redo runs that checkout's code (bench/against.py, in this interpreter) on a
demo of its own, alternating with this one, so both see the same load. The machine's load is
printed: on a shared machine the figures are inflated by it. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from against import as_installed, python_path  # bench/against.py, beside this script

HERE = Path(__file__).resolve().parent.parent
PARTS = ("start-up", "preflight", "commits", "shut-down", "wall", "CPU")
MAKE = ("import sys; from pathlib import Path; from retcon_sandbox.commands.demo import create; "
        "create(Path(sys.argv[1]), with_paths=True)")


class Checkout:
    def __init__(self, path: Path, work: Path, name: str) -> None:
        who = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
        self.env = as_installed({**os.environ, "PYTHONPATH": str(path), **who})
        self.name = name
        self.demo = work / name
        subprocess.run([sys.executable, "-c", MAKE, str(self.demo)], check=True, env=self.env)
        self.spec = self.demo / "history-spec.toml"
        self.original = self.spec.read_text()
        self.cli("--no-pipeline")  # fills the cache
        self.figures: list[dict[str, float]] = []

    def cli(self, *extra: str) -> tuple[list[dict[str, object]], float, float, float]:
        """The events, the start and end times, and the CPU seconds of one `execute`."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.time()
        proc = subprocess.run([sys.executable, "-m", "retcon_sandbox", "execute",
                               str(self.spec), "--non-interactive", "--json", *extra],
                              cwd=self.demo, env=self.env, capture_output=True, text=True)
        ended = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"{self.name}: execute exited {proc.returncode}\n{proc.stdout}\n"
                     f"{proc.stderr}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return ([json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")],
                started, ended, cpu)

    def redo(self) -> None:
        subprocess.run(["git", "-C", str(self.demo), "branch", "-q", "-D", "feature-clean"],
                       check=True)
        self.spec.write_text(self.original)
        events, started, ended, cpu = self.cli()
        at = {str(e["event"]): float(str(e["time"])) for e in reversed(events)}
        self.figures.append({
            "start-up": at["spec"] - started, "preflight": at["branch_created"] - at["spec"],
            "commits": at["summary"] - at["branch_created"], "shut-down": ended - at["summary"],
            "wall": ended - started, "CPU": cpu})

    def medians(self) -> dict[str, float]:
        return {part: statistics.median(f[part] for f in self.figures) for part in PARTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout (e.g. /work/main)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="retcon-bench-redo-"))
    checkouts = [Checkout(HERE / "runner", work, "this")]
    if args.against is not None:
        checkouts.append(Checkout(python_path(args.against.resolve()), work, "against"))
    load = os.getloadavg()[0]
    for _ in range(args.runs):
        for checkout in checkouts:
            checkout.redo()
    print(f"\nA redo of the demo's 4 cached commits, median of {args.runs} (seconds; load "
          f"{load:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores)\n")
    print(f"  {'':<10}" + "".join(f"{part:>11}" for part in PARTS))
    for checkout in checkouts:
        label = "this" if checkout.name == "this" else str(args.against)[-10:]
        print(f"  {label:<10}" + "".join(f"{v:11.2f}" for v in checkout.medians().values()))
    print()


if __name__ == "__main__":
    main()
