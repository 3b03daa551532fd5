"""Host memory on a large repository: peak RSS, side by side with the alternative, in one run.

    python3 bench/memory.py [--files 20000] [--big 8] [--big-mb 90] [--small-kb 15]

Makes a repository of FILES files (BIG of them BIG_MB MB, the rest SMALL_KB KB: about 1 GB
with the defaults) on `main`, and a `feature` branch of two commits (100 small files changed;
one large file replaced). Then, each in a process of its own, whose peak RSS is printed (and the
largest git process it started, separately):
- copy-in and copy-out through our helper: `main`'s tree streamed into a Docker sandbox, a
  command changes 100 files and writes a new large one, and the workspace comes back as a git
  tree (one streamed batch); against the same tree put into a plain container and taken back
  as a `docker cp` archive held in memory, the way the sandbox bench measures `docker cp`;
- `verify main..feature -j 2 --no-cache` through the command line's `main`, against `-j 1`.
Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20

COPY = """
import resource, sys
from pathlib import Path
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.workspace import sandbox_tree
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.spec.settings import DEFAULTS
repo = Repo(Path(sys.argv[1]))
tree = repo.tree_of("main")
engine = DockerEngine()
backend = DockerBackend(engine, sandboximages.default_image(), DEFAULTS, {},
                        Path("/tmp/bench.toml"))
with backend.open("bench-memory") as box:
    box.load_tree(repo.tree_tar(tree, DEFAULTS.max_file_size))
    change = box.run("for f in $(ls pkg0 | head -100); do echo changed >> pkg0/$f; done; "
                     "head -c 94371840 /dev/urandom > new.bin", 300)
    assert change.passed, change.output
    out = sandbox_tree(box, repo, DEFAULTS.max_file_size)
print(len(repo.tree_changes(tree, out)), "paths changed", file=sys.stderr)
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""

DOCKER_CP = """
import resource, sys
from pathlib import Path
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.spec.settings import DEFAULTS
repo = Repo(Path(sys.argv[1]))
engine = DockerEngine()
plain = engine.client.containers.run(sandboximages.default_image(), ["sleep", "infinity"],
                                     detach=True, network_mode="none",
                                     labels={"retcon-sandbox.run": "bench"})
try:
    plain.put_archive("/tmp", repo.tree_tar(repo.tree_of("main"), DEFAULTS.max_file_size).chunks)
    archive = b"".join(plain.get_archive("/tmp")[0])
    print(len(archive) >> 20, "MiB of archive", file=sys.stderr)
finally:
    plain.remove(force=True)
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""

# The command line, in a process of its own: its own peak and its largest child's, as above.
WRAP = """
import resource, sys
from retcon_sandbox.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.__stdout__)
sys.exit(code)
"""


def small(i: int, size: int) -> bytes:
    line = f"# file {i}: some text that a source file could hold, line after line\n".encode()
    return (line * (size // len(line) + 1))[:size]


def big_blocks(k: int, size: int) -> list[bytes]:
    seed = hashlib.sha256(f"big {k}".encode()).digest()
    block = bytearray()
    while len(block) < MIB:
        seed = hashlib.sha256(seed).digest()
        block += seed * 64  # compressible, but not trivially
    return [bytes(block[:MIB])] * (size // MIB)


def make_repo(path: Path, files: int, big: int, big_mb: int, small_kb: int) -> None:
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    proc = subprocess.Popen(["git", "-C", str(path), "fast-import", "--quiet"],
                            stdin=subprocess.PIPE)
    assert proc.stdin is not None
    send = proc.stdin.write

    def blob(mark: int, blocks: list[bytes]) -> None:
        send(b"blob\nmark :%d\ndata %d\n" % (mark, sum(map(len, blocks))))
        for block in blocks:
            send(block)
        send(b"\n")

    names = [f"data/big{k}.bin" for k in range(big)]
    names += [f"pkg{i % 100}/mod{i}.py" for i in range(files - big)]
    for mark, name in enumerate(names, 1):
        blob(mark, big_blocks(mark, big_mb * MIB) if name.endswith(".bin")
             else [small(mark, small_kb * 1024)])
    marks = len(names)

    def commit(branch: str, mark: int, parent: int | None, message: str,
               entries: list[tuple[str, int]]) -> None:
        send(f"commit refs/heads/{branch}\nmark :{mark}\n"
             f"committer bench <bench@localhost> 0 +0000\ndata {len(message)}\n{message}\n"
             .encode())
        if parent:
            send(f"from :{parent}\n".encode())
        for name, blob_mark in entries:
            send(f"M 100644 :{blob_mark} {name}\n".encode())
        send(b"\n")

    commit("main", marks + 1, None, "base", [(n, i) for i, n in enumerate(names, 1)])
    blob(marks + 2, [b"changed\n"])
    commit("feature", marks + 3, marks + 1, "change 100 files",
           [(n, marks + 2) for n in names[big : big + 100]])
    blob(marks + 4, big_blocks(0, big_mb * MIB))
    commit("feature", marks + 5, marks + 3, "replace a large file", [(names[0], marks + 4)])
    proc.stdin.close()
    if proc.wait():
        sys.exit("git fast-import failed")


def peak(argv: list[str], cwd: Path) -> tuple[int, int, float]:
    """(own peak RSS, largest child's peak RSS) in MiB, and the seconds it took."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 3) or "PEAK" not in proc.stdout:
        sys.exit(f"{argv[:4]} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    own, child = proc.stdout.rsplit("PEAK", 1)[1].split()[:2]
    return int(own) >> 10, int(child) >> 10, seconds


def row(what: str, ours: tuple[int, int, float], other: tuple[int, int, float]) -> None:
    def cell(m: tuple[int, int, float]) -> str:
        return f"{m[0]:5d} MiB ({m[1]:4d}) {m[2]:5.1f} s"
    print(f"  {what:<52} {cell(ours):>24}   {cell(other):>24}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--big", type=int, default=8)
    parser.add_argument("--big-mb", type=int, default=90)
    parser.add_argument("--small-kb", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="retcon-bench-memory-") as scratch:
        repo = Path(scratch) / "repo"
        start = time.perf_counter()
        make_repo(repo, args.files, args.big, args.big_mb, args.small_kb)
        total = (args.big * args.big_mb * MIB + (args.files - args.big) * args.small_kb * 1024)
        print(f"\nretcon-sandbox host memory: a repository of {args.files} files, "
              f"{total / 1e9:.2f} GB ({args.big} of {args.big_mb} MB), made in "
              f"{time.perf_counter() - start:.0f} s\n")
        print(f"  {'':<52} {'peak RSS (largest child)':>24}   {'alternative':>24}")
        ours = peak([sys.executable, "-c", COPY, str(repo)], repo)
        other = peak([sys.executable, "-c", DOCKER_CP, str(repo)], repo)
        row("copy-in + copy-out (ours vs docker cp archive)", ours, other)
        verify = ["verify", "main..feature", "--build", "test -s data/big0.bin", "--test", "true",
                  "--no-cache", "--memory", "3g"]
        two = peak([sys.executable, "-c", WRAP, *verify, "-j", "2"], repo)
        one = peak([sys.executable, "-c", WRAP, *verify, "-j", "1"], repo)
        row("verify main..feature (2 commits), -j 2 vs -j 1", two, one)
        print("\n  Each: the Python process's own peak RSS, in brackets the largest process it "
              "started\n  and waited for (git), then the wall time.\n")


if __name__ == "__main__":
    main()
