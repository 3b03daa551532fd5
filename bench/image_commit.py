"""What committing a prepared environment costs on an image, beside another image.

    python3 bench/image_commit.py [--image IMAGE] [--against IMAGE] [--runs 5]

A prepared environment is a container that ran `[sandbox] setup`, committed as an image. On
fuse-overlayfs the engine walks every file of the image to commit a container, however little
it wrote. For each image (the current base by default, and --against, e.g. an older base
tag that `images list` still shows), this prints its number of files, and the median wall
time of `docker commit` and `docker diff` of a container that wrote one file. Uses the docker
CLI; removes what it made. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from retcon_sandbox.backends.docker import sandboximages


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def timed(*args: str) -> float:
    start = time.perf_counter()
    docker(*args)
    return time.perf_counter() - start


def measure(image: str, runs: int) -> tuple[int, float, float]:
    files = int(docker("run", "--rm", "--network", "none", image, "sh", "-c",
                       "find / -xdev | wc -l"))
    container = docker("run", "-d", "--network", "none", image, "sh", "-c",
                       "echo made > /var/tmp/made")
    try:
        docker("wait", container)
        commits, diffs = [], []
        for _ in range(runs):
            start = time.perf_counter()
            made = docker("commit", container)
            commits.append(time.perf_counter() - start)
            docker("rmi", made)
            diffs.append(timed("diff", container))
    finally:
        docker("rm", "-f", container)
    return files, statistics.median(commits), statistics.median(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default=sandboximages.default_image())
    parser.add_argument("--against")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    images = [args.image, *([args.against] if args.against else [])]
    print(f"| image | files | docker commit (median of {args.runs}) | docker diff |")
    print("|---|---:|---:|---:|")
    for image in images:
        files, commit, diff = measure(image, args.runs)
        print(f"| {image} | {files:,} | {commit:.2f} s | {diff:.2f} s |")


if __name__ == "__main__":
    main()
