"""How `plan`'s time grows with the branch: synthetic branches of 200, 2,000 and 6,000 changed
files (a project's folders of code, tests, docs and CI; WIP commits of 1 to 4 files), timed
for reading the facts and for the draft, beside the commits drafted.

    python3 bench/plan_scale.py [--sizes 200,2000,6000] [--repeat 3]

Each time is the least of `--repeat` runs (as timeit takes it: the others measure the machine's
other work). Nothing is asserted: the figures to read are the time per file, which should not
grow with the branch, and the number of commits, which should stay sensible (not one commit).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from retcon_sandbox.commands.plan import choose, read_facts
from retcon_sandbox.plan.draft import draft
from retcon_sandbox.repo.gitrepo import Repo


def path_of(i: int, rng: random.Random) -> str:
    package = f"pkg{i % 12}"
    sub = f"mod{(i // 12) % 9}"
    kind = rng.choice(("code", "code", "code", "test", "docs", "ci"))
    if kind == "test":
        return f"tests/{package}/{sub}/test_f{i}.py"
    if kind == "docs":
        return f"docs/{package}/f{i}.md"
    if kind == "ci":
        return f".github/workflows/w{i}.yml"
    return f"src/{package}/{sub}/f{i}.py"


def make(directory: Path, files: int, seed: int) -> Repo:
    rng = random.Random(seed)
    subprocess.run(["git", "init", "-q", "-b", "main", str(directory)], check=True)
    paths = [path_of(i, rng) for i in range(files)]
    stream = bytearray(b"commit refs/heads/main\ncommitter B <b@x> 1700000000 +0000\n"
                       b"data 4\nbase\nM 100644 inline README\ndata 2\nx\n\n")
    order = paths[:]
    rng.shuffle(order)
    n, when = 0, 1700000001
    while n < len(order):
        chunk = order[n:n + rng.randint(1, 4)]
        n += len(chunk)
        stream += (f"commit refs/heads/feature\ncommitter B <b@x> {when} +0000\ndata 3\nwip\n"
                   + ("from refs/heads/main\n" if when == 1700000001 else "")).encode()
        when += 1
        for p in chunk:
            body = f"def f():\n    return '{p}'\n".encode()
            stream += f"M 100644 inline {p}\ndata {len(body)}\n".encode() + body + b"\n"
    subprocess.run(["git", "-C", str(directory), "fast-import", "--quiet"],
                   input=bytes(stream), check=True)
    return Repo(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="200,2000,6000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| changed files | read facts (s) | draft (s) | per file (ms) | commits drafted |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="retcon-bench-scale-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            repo = make(Path(tmp) / str(size), size, size)
            read = drafted = float("inf")
            for _ in range(max(1, args.repeat)):
                started = time.perf_counter()
                facts = read_facts(choose(repo, "feature", "main", None))
                read = min(read, time.perf_counter() - started)
                started = time.perf_counter()
                groups = draft(facts).groups
                drafted = min(drafted, time.perf_counter() - started)
            print(f"| {size} | {read:.2f} | {drafted:.2f} | "
                  f"{1000 * (read + drafted) / size:.2f} | {len(groups)} |")


if __name__ == "__main__":
    main()
