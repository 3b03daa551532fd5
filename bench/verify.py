"""The verification cache and `verify -j`, side by side with the alternative, in one run.

    python3 bench/verify.py [--sandbox docker|local] [--commits 24]

Prints, each through the real command line (Python start-up included):
- redoing the demo's reconstruction (cleaned branch and history entries deleted) with every tree
  cached, against the same redo with --no-cache (what every redo cost before the cache);
- `verify -j 1` against `verify -j 2` (both --no-cache) on the demo's clean branch and on a
  generated project of real size: COMMITS commits of a Python package whose test suite grows to
  a second or two, and `verify` again with every result cached.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", choices=("docker", "local"), default="docker")
    parser.add_argument("--commits", type=int, default=24)
    args = parser.parse_args()
    box = ("--sandbox", args.sandbox)
    work = Path(tempfile.mkdtemp(prefix="retcon-bench-"))
    os.environ.setdefault("GIT_AUTHOR_NAME", "bench")
    os.environ.setdefault("GIT_AUTHOR_EMAIL", "bench@localhost")
    os.environ.setdefault("GIT_COMMITTER_NAME", "bench")
    os.environ.setdefault("GIT_COMMITTER_EMAIL", "bench@localhost")

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
