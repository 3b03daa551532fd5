"""The verification cache and `verify -j`, side by side with the alternative, in one run.

    python3 bench/verify.py [--sandbox docker|local] [--commits 24] [--only cache|scaling]
                            [--cpu-commits 8] [--burn 3] [--engine HOST ...]

Prints, each through the real command line (Python start-up included):
- redoing the demo's reconstruction (cleaned branch and history entries deleted) with every tree
  cached, against the same redo with --no-cache (what every redo cost before the cache);
- `verify -j 1` against `verify -j 2` (both --no-cache) on the demo's clean branch and on a
  generated project of real size: COMMITS commits of a Python package whose test suite grows to
  a second or two, and `verify` again with every result cached.
- scaling: `verify -j 1` against `-j 2` on a CPU-bound suite (CPU_COMMITS commits whose test
  burns BURN seconds of CPU in python), with neither look-ahead nor reuse
  (RETCON_SANDBOX_VERIFY_AHEAD=0 --no-reuse, what 0.3.0 did); with the look-ahead (the next
  sandbox made ready while a tree's commands run, removal off the critical path) and a fresh
  container per tree (--no-reuse); with the look-ahead and a worker's used containers wiped and
  reused; these three with each tree's git metadata made in an exec of its own
  (RETCON_SANDBOX_VERIFY_PREPARE=exec); and as `verify` does by default: reused, and the git
  metadata made in the first command's exec when the workers take every core (-j 2 here), in
  its own exec ahead of time when a core is left (-j 1). Each with the per-phase breakdown that
  `verify --json` reports (`verify_phases`: seconds summed over threads) and the machine's
  load.
Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from retcon_sandbox.commands.demo import create
from retcon_sandbox.repo.gitrepo import Repo

CLI = (sys.executable, "-m", "retcon_sandbox")
BUILD = "python3 -m compileall -q calc tests"
TEST = "python3 -m pytest -q -p no:cacheprovider"


def timed(*args: str, cwd: Path, expect: int = 0) -> float:
    start = time.perf_counter()
    proc = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if proc.returncode != expect:
        sys.exit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return seconds


def row(what: str, ours: float, other: float, names: tuple[str, str]) -> None:
    print(f"  {what:<46} {names[0]:>12} {ours:6.2f} s   {names[1]:>12} {other:6.2f} s"
          f"   ({other / ours:.1f}x)")


def module(k: int) -> str:
    return (f'"""Module {k} of a generated project."""\n\n\n'
            f"def scale_{k}(values):\n    return [v * {k + 1} for v in values]\n\n\n"
            f"def work_{k}(n):\n    total = 0\n    for i in range(n):\n"
            f"        total += (i * {k + 1}) % 7\n    return total\n")


def tests(k: int) -> str:
    cases = "\n\n".join(
        f"def test_scale_{k}_{j}():\n    assert scale_{k}([{j}, 1]) == [{j * (k + 1)}, {k + 1}]"
        for j in range(8))
    return (f"from calc.m{k} import scale_{k}, work_{k}\n\n\n{cases}\n\n\n"
            f"def test_work_{k}():\n    assert work_{k}(400_000) >= 0\n")


def generated(directory: Path, commits: int) -> Path:
    """A Python package of `commits` commits on `feature`; each adds a module and its tests."""
    repo = Repo.init(directory, "main")
    repo.commit_files("main", {"calc/__init__.py": "", "tests/__init__.py": "",
                               "README.md": "# calc\n"}, "Start calc")
    repo.update_branch("feature", repo.resolve("main"), None, "branch")
    for k in range(commits):
        repo.commit_files("feature", {f"calc/m{k}.py": module(k),
                                      f"tests/test_m{k}.py": tests(k)}, f"Add module {k}")
    repo.check_out("main")
    return directory


BURN = ("python3 -c \"import time; end = time.process_time() + {seconds}\n"
        "while time.process_time() < end: sum(range(10000))\"")
PHASE_NAMES = ("waited", "create", "wipe", "git_wait", "git_tar", "load", "prepare", "commands",
               "remove", "environment")


def load() -> str:
    return "load average " + ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def cgroup_note() -> str:
    """How the engine's containers weigh against the rest of the machine (cgroup v1 cpu)."""
    parent = Path("/sys/fs/cgroup/cpu/docker")
    if not (parent / "cpu.shares").exists():
        return "cgroup: not v1 with a /docker cpu group here (nothing to say about its weight)"
    shares = (parent / "cpu.shares").read_text().strip()
    quota = (parent / "cpu.cfs_quota_us").read_text().strip()
    running = next(line.split()[1] for line in Path("/proc/stat").read_text().splitlines()
                   if line.startswith("procs_running"))
    return (f"cgroup v1: every container sits under /docker (cpu.shares {shares}, quota {quota}):"
            f" against busy processes outside containers ({running} running now), all the "
            "sandboxes together weigh as much as one of them, so a second sandbox halves the "
            "first one's CPU instead of adding a core")


def cpu_ticks() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def verify_json(cwd: Path, *args: str, env: dict[str, str] | None = None
                ) -> tuple[float, dict[str, Any]]:
    """Wall time of `verify ... --json`, and its verify_phases event (with `idle`: the share of
    the machine's CPU time that was idle meanwhile)."""
    ticks = cpu_ticks()
    start = time.perf_counter()
    proc = subprocess.run([*CLI, "verify", *args, "--json"], cwd=cwd, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"verify {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n"
                 f"{proc.stderr}")
    idle, total = (after - before for after, before in zip(cpu_ticks(), ticks, strict=True))
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    phases = next(e for e in events if e["event"] == "verify_phases")
    busy = (total - idle) / os.sysconf("SC_CLK_TCK")
    return seconds, {**phases, "idle": idle / max(total, 1), "busy": busy}


def scaling(work: Path, commits: int, burn: float, box: tuple[str, ...],
            engines: list[str]) -> None:
    project = generated(work / "cpu", commits)
    test = BURN.format(seconds=burn)
    base = ("main..feature", "--test", test, *box, "--no-cache")
    print(f"\nverify -j 1 vs -j 2 on a CPU-bound suite ({commits} commits, each test burns "
          f"{burn:g} s of CPU; {os.cpu_count()} cores; {load()} before):")
    rows: list[tuple[str, float, dict[str, Any]]] = []
    own_exec = {"RETCON_SANDBOX_VERIFY_PREPARE": "exec"}
    variants: list[tuple[str, dict[str, str], tuple[str, ...]]] = [
        ("no look-ahead (as 0.3.0)", {"RETCON_SANDBOX_VERIFY_AHEAD": "0", **own_exec},
         ("--no-reuse",)),
        ("look-ahead, fresh containers", own_exec, ("--no-reuse",)),
        ("look-ahead, reused containers", own_exec, ()),
        ("reused, git metadata with the command", {}, ())]
    if engines:
        print(f"  (engines: {' + '.join(engines)})")
        variants.append((f"look-ahead, {len(engines)} engines", {},
                         tuple(a for e in engines for a in ("--engine", e))))
    for name, env, extra in variants:
        for jobs in ("1", "2"):
            seconds, phases = verify_json(project, *base, *extra, "-j", jobs, env=env)
            rows.append((f"{name}, -j {jobs}", seconds, phases))
        one, two = rows[-2][1], rows[-1][1]
        print(f"  {name:<44} -j 1 {one:6.2f} s   -j 2 {two:6.2f} s   speedup {one / two:.2f}x"
              f"   (ideal {commits * burn:.0f} s / {commits * burn / 2:.0f} s of commands)")
    print(f"  ({load()} after; other processes share these cores, so the figures are "
          "inflated and the ratio noisy: see `cpu/cmd` and `idle` below)")
    if box[-1] == "docker":
        print(f"  {cgroup_note()}")
    print("\n  Per phase (seconds summed over threads; `waited`: a worker waiting for its next "
          "sandbox, the overhead on the critical path):")
    print("  `cpu/cmd`: the CPU a test got while it ran (its CPU seconds over its wall seconds: "
          "1.00 is a whole core); `idle`: the machine's idle share meanwhile (0 %: saturated)")
    print("  " + " " * 46 + "".join(f"{n:>12}" for n in (*PHASE_NAMES, "cpu/cmd", "idle")))
    for name, _, phases in rows:
        share = commits * burn / max(phases["seconds"]["commands"], 1e-9)
        print(f"  {name:<46}" + "".join(f"{phases['seconds'].get(n, 0.0):12.2f}"
                                        for n in PHASE_NAMES)
              + f"{share:12.2f}{phases['idle']:11.0%} ")
    floors(rows, commits * burn)


def floors(rows: list[tuple[str, float, dict[str, Any]]], tests: float) -> None:
    """What serialises: the machine's busy CPU seconds during each run against its wall time.
    `floor` (busy / cores) is the least wall time that much CPU allows; what the run took over
    it was not CPU-bound (start-up, waiting for a sandbox, a tree running alone at the end)."""
    cores = os.cpu_count() or 1
    print(f"\n  CPU against wall time (`busy`: every process's CPU meanwhile, from /proc/stat; "
          f"`tests`: the {tests:.0f} s the tests burn; `floor`: busy / {cores} cores, the least "
          "wall time that CPU allows; `over`: wall - floor, the time not CPU-bound):")
    print("  " + " " * 46 + "".join(f"{n:>10}" for n in ("wall", "busy", "tests", "other",
                                                        "floor", "over")))
    for name, seconds, phases in rows:
        busy = phases["busy"]
        print(f"  {name:<46}" + "".join(f"{v:10.2f}" for v in (
            seconds, busy, tests, busy - tests, busy / cores, seconds - busy / cores)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", choices=("docker", "local"), default="docker")
    parser.add_argument("--commits", type=int, default=24)
    parser.add_argument("--only", choices=("cache", "scaling"))
    parser.add_argument("--cpu-commits", type=int, default=8)
    parser.add_argument("--burn", type=float, default=3.0, help="CPU seconds per test")
    parser.add_argument("--engine", action="append", default=[],
                        help="also run the scaling figures over these engines (repeatable)")
    args = parser.parse_args()
    box = ("--sandbox", args.sandbox)
    work = Path(tempfile.mkdtemp(prefix="retcon-bench-"))
    os.environ.setdefault("GIT_AUTHOR_NAME", "bench")
    os.environ.setdefault("GIT_AUTHOR_EMAIL", "bench@localhost")
    os.environ.setdefault("GIT_COMMITTER_NAME", "bench")
    os.environ.setdefault("GIT_COMMITTER_EMAIL", "bench@localhost")
    if args.only != "cache":
        scaling(work, args.cpu_commits, args.burn, box, args.engine)
    if args.only == "scaling":
        return

    demo = work / "demo"
    spec = create(demo, with_paths=True)
    original = spec.read_text()
    timed("execute", str(spec), *box, "--non-interactive", cwd=demo)  # fills the cache

    def redo(*extra: str) -> float:
        subprocess.run(["git", "-C", str(demo), "branch", "-q", "-D", "feature-clean"],
                       check=True)
        spec.write_text(original)
        return timed("execute", str(spec), *box, "--non-interactive", *extra, cwd=demo)

    cached_redo = min(redo() for _ in range(3))
    full_redo = redo("--no-cache")
    print(f"\nretcon-sandbox verification cache and verify -j ({args.sandbox} sandbox, "
          f"{os.cpu_count()} cores)\n")
    print("Redo of the demo's reconstruction (4 commits; branch and history deleted):")
    row("execute, every tree cached vs --no-cache", cached_redo, full_redo,
        ("cached", "--no-cache"))

    one = timed("verify", str(spec), *box, "--no-cache", "-j", "1", cwd=demo)
    two = timed("verify", str(spec), *box, "--no-cache", "-j", "2", cwd=demo)
    hit = timed("verify", str(spec), *box, cwd=demo)
    print("\nverify on the demo's clean branch (4 commits):")
    row("verify -j 2 vs -j 1 (both --no-cache)", two, one, ("-j 2", "-j 1"))
    row("verify, every result cached vs -j 2 --no-cache", hit, two, ("cached", "-j 2"))

    project = generated(work / "calc", args.commits)
    commands = ("--build", BUILD, "--test", TEST)
    one = timed("verify", "main..feature", *commands, *box, "--no-cache", "-j", "1",
                cwd=project)
    two = timed("verify", "main..feature", *commands, *box, "--no-cache", "-j", "2",
                cwd=project)
    hit = timed("verify", "main..feature", *commands, *box, cwd=project)
    out = subprocess.run([*CLI, "verify", "feature", *commands, *box, "--no-cache", "--json"],
                         cwd=project, capture_output=True, text=True).stdout
    last = next(json.loads(line) for line in out.splitlines() if '"commit_verified"' in line)
    print(f"\nverify on a generated project ({args.commits} commits; the last one's build and "
          f"tests take {last['seconds']:.1f} s):")
    row("verify -j 2 vs -j 1 (both --no-cache)", two, one, ("-j 2", "-j 1"))
    row("verify, every result cached vs -j 2 --no-cache", hit, two, ("cached", "-j 2"))
    print()


if __name__ == "__main__":
    main()
