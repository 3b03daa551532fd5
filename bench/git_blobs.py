"""What a sandbox's git metadata spends on the tree's blobs, where it runs: in a container of
the base image, on the engine's storage driver (fuse-overlayfs on this machine), this
checkout's supervisor (`write_blobs`: one pack and its index) beside the supervisor of
`--before` (default 0165b1b, the last to write a loose object per blob), and
beside git's own loose objects (`git hash-object -w --stdin-paths`). Each is followed by the
removal of `.git` that the next commit's exec makes first.

    python3 bench/git_blobs.py [--before REV] [--mirrors /work/.mirror] [--repo OWNER+NAME ...]
                               [--repeat 3]

Each repository's HEAD tree is copied into the container once; each way is timed `--repeat`
times and the least is printed (the others measure the machine's other work). Needs the base
image (`retcon-sandbox images build`). Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import os, subprocess, sys, time
import importlib.util
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
supervisor = load("now", "/supervisor/supervisor.py")
before = load("before", "/before.py")
env = {**os.environ, "HOME": "/tmp", **supervisor.GIT_IDENTITY}
listing = sys.stdin.buffer.read()
paths = [r.partition(b"\t")[2] for r in listing.split(b"\0")
         if r.split(b" ", 1)[0] in supervisor.BLOB_MODES]

def fresh():
    supervisor.remove("/w/.git")
    subprocess.run(["git", "init", "-q", "/w"], env=env, check=True)

def packed():
    supervisor.write_blobs("/w", listing, "sha1")

def earlier():
    before.write_blobs("/w", listing, "sha1")

def loose():
    subprocess.run(["git", "-C", "/w", "hash-object", "-w", "--no-filters", "--stdin-paths"],
                   input=b"\n".join(paths) + b"\n", env=env, check=True,
                   stdout=subprocess.DEVNULL)

best = {}
for _ in range(int(sys.argv[1])):
    for name, write in (("pack", packed), ("before", earlier), ("loose", loose)):
        fresh()
        started = time.monotonic()
        write()
        wrote = time.monotonic() - started
        started = time.monotonic()
        supervisor.remove("/w/.git")
        removed = time.monotonic() - started
        old = best.get(name, (9e9, 9e9))
        best[name] = (min(old[0], wrote), min(old[1], removed))
print(len(paths), *(f"{best[n][0]:.3f} {best[n][1]:.3f}" for n in ("pack", "before", "loose")))
"""


def git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True,
                          capture_output=True).stdout


def image() -> str:
    out = subprocess.run([sys.executable, "-m", "retcon_sandbox", "images", "tag", "base"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip()


def measure(mirror: Path, base_image: str, repeat: int, before: bytes) -> str:
    listing = b"".join(
        record.replace(b" blob ", b" ", 1) + b"\0"
        for record in git(mirror, "ls-tree", "-r", "-z", "--full-tree", "HEAD").split(b"\0")
        if b" blob " in record.partition(b"\t")[0])
    with tempfile.TemporaryDirectory(prefix="retcon-bench-blobs-") as tmp:
        archive = Path(tmp) / "tree.tar"
        archive.write_bytes(git(mirror, "archive", "--format=tar", "HEAD"))
        (Path(tmp) / "before.py").write_bytes(before)
        script = ("mkdir /w && tar -xf /tree.tar -C /w && "
                  f"python3 -c {_quote(PROBE)} {repeat}")
        out = subprocess.run(
            ["docker", "run", "--rm", "-i", "--network", "none",
             "-v", f"{archive}:/tree.tar:ro", "-v", f"{ROOT / 'sandbox'}:/supervisor:ro",
             "-v", f"{Path(tmp) / 'before.py'}:/before.py:ro",
             base_image, "sh", "-c", script],
            input=listing, check=True, capture_output=True).stdout.decode()
    files, *figures = out.split()
    pairs = [f"{float(w):.3f} + {float(r):.3f}"
             for w, r in zip(figures[::2], figures[1::2], strict=True)]
    return f"| {mirror.parent.name} | {files} | {' | '.join(pairs)} |"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--repo", nargs="*", default=["mahmoud+boltons", "tj+commander.js",
                                                      "python-attrs+attrs"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default="0165b1b",
                        help="the revision whose supervisor wrote loose objects")
    args = parser.parse_args()
    driver = subprocess.run(["docker", "info", "--format", "{{.Driver}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    base_image = image()
    print(f"storage driver: {driver}; seconds, the least of {args.repeat}: write + remove")
    before = git(ROOT, "show", f"{args.before}:sandbox/supervisor.py")
    print(f"| repository | blobs | one pack (this checkout) | loose, {args.before}'s supervisor "
          "| loose, git hash-object |")
    print("|---|---:|---:|---:|---:|")
    for name in args.repo:
        mirror = args.mirrors / name / "repo"
        if not mirror.exists():
            print(f"| {name} | not fetched under {args.mirrors} | | |")
            continue
        print(measure(mirror, base_image, args.repeat, before), flush=True)


if __name__ == "__main__":
    main()
