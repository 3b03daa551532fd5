"""What the test suite spends: wall time and CPU-seconds of the whole pytest process tree.

    python3 bench/suite.py [--full] [--against REF] [--top N] [--workers N] [-- PYTEST_ARGS]

Runs the fast loop (`pytest -n 2 -m "not slow" --ignore=tests/docker`), or with --full the
whole suite (`pytest -n 2`, the Docker tier included), from this checkout, with the
interpreter running this script (a venv's, with the development extras installed). Printed:
the wall time, the CPU-seconds of every process the run started, the tests passed and failed,
and the costliest tests, modules and fixtures by CPU (bench/suite_plugin.py measures them).

CPU is counted in a cgroup made for the run (as root, where /sys/fs/cgroup is writable): every
process in it counts, the forked command lines, their git and the fork servers included,
whether or not anyone waited for them. Elsewhere it is the user+sys time of the children the
run waited for (as `/usr/bin/time` counts). Containers run in the Docker engine's own cgroup:
their CPU is printed apart, as the growth of the engine's cgroup during the run, which counts
every container on the engine (another run's too, on a shared machine).

With --against REF, the same run is made first on REF's tests and code (a temporary git
worktree; its packages put first on PYTHONPATH by bench/against.py), then on this checkout's,
and the two are printed side by side. Wall time is noisy on a shared machine; CPU-seconds are
the steadier figure. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from against import python_path  # bench/against.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
CGROUPS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup"))  # v1, then v2
DOCKER_GROUPS = (Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage"),
                 Path("/sys/fs/cgroup/system.slice/docker.service/cpu.stat"))
FAST = ["-m", "not slow", "--ignore=tests/docker"]


@dataclass
class Figures:
    label: str
    wall: float = 0.0
    cpu: float = 0.0
    counted: str = ""  # how CPU was counted
    containers: float | None = None
    outcome: str = ""
    tests: dict[str, float] = field(default_factory=dict)
    fixtures: dict[str, list[float]] = field(default_factory=dict)  # name -> [cpu, count]


def read_usage(path: Path) -> float:
    text = path.read_text()
    if path.name == "cpu.stat":
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
    return int(text) / 1e9


@contextlib.contextmanager
def cgroup() -> Iterator[Path | None]:
    """A cgroup of our own for the run, or None where none can be made."""
    for parent in CGROUPS:
        usage = parent / "cpuacct.usage" if parent.name == "cpuacct" else parent / "cpu.stat"
        if not usage.exists() and not (parent / "cgroup.controllers").exists():
            continue
        group = parent / f"retcon-bench-{os.getpid()}-{time.monotonic_ns()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            yield group
        finally:
            for _ in range(50):  # leftovers of the run end; then the groups can go
                try:
                    for child in group.iterdir():
                        if child.is_dir():
                            child.rmdir()
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        return
    yield None


def docker_usage() -> float | None:
    for path in DOCKER_GROUPS:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return read_usage(path)
    return None


def run(label: str, checkout: Path, args: list[str], env: dict[str, str]) -> Figures:
    figures = Figures(label)
    with tempfile.TemporaryDirectory(prefix="retcon-bench-suite-") as out, cgroup() as group:
        env = {**env, "RETCON_BENCH_OUT": out,
               "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(BENCH)]))}
        if group is not None:
            env["RETCON_BENCH_CGROUP"] = str(group)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "-p", "suite_plugin", *args]
        print(f"[{label}] {' '.join(command)}  (in {checkout})", file=sys.stderr, flush=True)

        def enter() -> None:
            if group is not None:
                (group / "cgroup.procs").write_text(str(os.getpid()))

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        engine = docker_usage()
        start = time.monotonic()
        proc = subprocess.run(command, cwd=checkout, env=env, preexec_fn=enter,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        figures.wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if engine is not None:
            now = docker_usage()
            figures.containers = None if now is None else now - engine
        if group is not None:
            usage = group / "cpuacct.usage"
            figures.cpu = read_usage(usage if usage.exists() else group / "cpu.stat")
            figures.counted = "cgroup: every process of the run"
        else:
            figures.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            figures.counted = "rusage: the children waited for"
        lines = proc.stdout.strip().splitlines()
        figures.outcome = lines[-1].strip("= ") if lines else f"exit {proc.returncode}"
        if proc.returncode not in (0, 1):
            sys.stderr.write(proc.stdout[-5000:])
        for failed in (line for line in lines if line.startswith(("FAILED ", "ERROR tests"))):
            print(f"[{label}] {failed}", file=sys.stderr)
        for path in Path(out).glob("*.jsonl"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["kind"] == "test":
                    figures.tests[record["id"]] = record["cpu"]
                else:
                    entry = figures.fixtures.setdefault(
                        f"{record['id']} ({record['scope']})", [0.0, 0])
                    entry[0] += record["cpu"]
                    entry[1] += 1
    return figures


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="retcon-bench-ref-")) / "checkout"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(folder),
                    ref], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)],
                       check=False)


def modules(figures: Figures) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for test, cpu in figures.tests.items():
        total[test.split("::")[0]] += cpu
    return total


def show(runs: list[Figures], top: int) -> None:
    width = 22
    print()
    print(f"{'':28}" + "".join(f"{f.label:>{width}}" for f in runs))
    rows = [("wall (s)", [f"{f.wall:.1f}" for f in runs]),
            ("CPU-seconds", [f"{f.cpu:.1f}" for f in runs]),
            ("containers' CPU-s (engine)",
             ["-" if f.containers is None else f"{f.containers:.1f}" for f in runs]),
            ("tests measured", [str(len(f.tests)) for f in runs])]
    for name, values in rows:
        print(f"{name:28}" + "".join(f"{v:>{width}}" for v in values))
    for f in runs:
        print(f"{f.label}: {f.outcome}  [CPU counted by {f.counted}]")
    last = runs[-1]
    sections = [("tests", last.tests),
                ("modules", modules(last)),
                ("fixtures (setup, summed)", {k: v[0] for k, v in last.fixtures.items()})]
    for title, costs in sections:
        print(f"\ncostliest {title} by CPU-seconds ({last.label}"
              + (f"; {runs[0].label} beside" if len(runs) > 1 else "") + "):")
        before = {"tests": runs[0].tests, "modules": modules(runs[0]),
                  "fixtures (setup, summed)": {k: v[0] for k, v in runs[0].fixtures.items()}}[title]
        for name, cpu in sorted(costs.items(), key=lambda kv: -kv[1])[:top]:
            extra = ""
            if title.startswith("fixtures"):
                extra = f" x{last.fixtures[name][1]}"
            if len(runs) > 1:
                was = before.get(name)
                extra += "   (was " + ("-" if was is None else f"{was:.2f}") + ")"
            print(f"  {cpu:8.2f}  {name}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the whole suite, Docker tier too")
    parser.add_argument("--against", metavar="REF", help="also run REF's suite, first")
    parser.add_argument("--top", type=int, default=25, help="how many costliest to print")
    parser.add_argument("--workers", default="2", help="pytest -n (default 2)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    pytest_args = ["-n", args.workers, *([] if args.full else FAST), *args.pytest_args]
    env = {**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true"}
    runs = []
    if args.against:
        with worktree(args.against) as checkout:
            env_ref = {**env, "PYTHONPATH": str(python_path(checkout))}
            runs.append(run(args.against, checkout, pytest_args, env_ref))
    runs.append(run("this checkout", ROOT, pytest_args, env))
    show(runs, args.top)


if __name__ == "__main__":
    main()
