"""`[sandbox] setup` and a real test suite in the sandbox, side by side with the alternative.

    python3 bench/setup.py [--project more-itertools==10.5.0] [--allow NET]

Takes a real project's source distribution from PyPI (more-itertools: about 660 tests and 2,300
subtests), makes a repository of it, and prints, each through the real command line:
- `verify` of its last commit with a setup (`pip install -r requirements.txt`, installing a
  current pytest) prepared cold (`--no-cache`), against the same verification, its tests run
  again, when the prepared environment is found (the alternative: preparing it every time);
- the test suite's time inside the sandbox against the same command on the host (the command
  alone, and the sandbox's whole verification with its start-up);
- what the git metadata (`git_metadata = true`, the default) adds to each sandbox of this tree;
- a second setup of the same inputs (`--no-cache` again) with the package cache the first one
  filled, against one without it (`--no-package-cache`): what pip said it downloaded or took
  from its cache, and the bytes that came in through the egress proxy. On a network whose
  TLS proxy strips PyPI's Cache-Control, the egress proxy restores it for PyPI's files.
Needs PyPI. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.spec.settings import DEFAULTS

CLI = (sys.executable, "-m", "retcon_sandbox")
PREPARED: list[str] = []  # the environment this run prepared: removed at the end
ALLOW: list[str] = []  # --setup-allow-address NET for every run (--allow)
TEST = "python -m pytest -q -p no:cacheprovider tests"
SPEC = f"""source = "main"
remote = "main~1"
cleaned = "bench-clean"

[sandbox]
setup = "pip install -r requirements.txt"
test = "{TEST}"

[[commit]]
message = "bench"
paths = ["requirements.txt"]
"""


def fetch(project: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                    ":all:", "-d", str(into), project], check=True)
    archive = next(into.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return next(p for p in into.iterdir() if p.is_dir())


def make_repo(source: Path, directory: Path) -> Repo:
    """The sdist as a first commit; a second adds requirements.txt (unique to this run, so the
    first setup is cold)."""
    files: dict[str, str | None] = {
        str(p.relative_to(source)): p.read_text(errors="surrogateescape")
        for p in sorted(source.rglob("*")) if p.is_file()}
    repo = Repo.init(directory, "main")
    repo.commit_files("main", files, "Import the source distribution")
    repo.commit_files("main", {"requirements.txt": f"# {uuid.uuid4().hex}\npytest>=8\n"},
                      "Test with a current pytest")
    (directory / "bench-spec.toml").write_text(SPEC)
    return repo


def verify(directory: Path, cold: bool, *extra: str) -> tuple[float, dict[str, float]]:
    """Wall time of verifying the last commit, and the seconds of its events. Cold:
    `--no-cache`, which prepares the environment again too; warm: with the verification
    results forgotten (so the tests run), from the environment kept."""
    subprocess.run(["git", "update-ref", "-d", "refs/notes/retcon-sandbox"], cwd=directory,
                   check=False)
    start = time.perf_counter()
    proc = subprocess.run([*CLI, "verify", "main~1..main", "--spec", "bench-spec.toml",
                           "--json", *(["--no-cache"] if cold else []), *extra,
                           *(a for net in ALLOW for a in ("--setup-allow-address", net))],
                          cwd=directory,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"verify exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr}")
    seen: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        event = json.loads(line)
        if event["event"] == "setup_ready":
            seen["setup"] = float(event["seconds"])
            seen["bytes"] = float(event.get("downloaded") or 0)
            PREPARED.append(str(event["tag"]))
        if event["event"] == "commit_verified":  # no build: its seconds are the tests'
            seen["test"] = float(event["seconds"])
        line = str(event.get("line", "")) if event["event"] == "setup_output" else ""
        for said, name in (("Using cached", "cached"), ("Downloading", "downloaded")):
            seen[name] = seen.get(name, 0) + (1 if said in line else 0)
    return wall, seen


def git_metadata(repo: Repo, spec: Path, rounds: int = 5) -> tuple[float, float]:
    """Seconds to prepare a loaded sandbox's workspace with and without the git metadata."""
    engine = DockerEngine()
    image = sandboximages.ensure(engine, sandboximages.default_image(), print)
    backend = DockerBackend(engine, image, DEFAULTS, {}, spec)
    with_git: list[float] = []
    without: list[float] = []
    for _ in range(rounds):
        for git, into in ((True, with_git), (False, without)):
            with backend.open("bench") as box:
                box.load_tree(repo.tree_tar(repo.tree_of("main"), DEFAULTS.max_file_size))
                start = time.perf_counter()
                box.prepare_workspace(git, "v1.0" if git else None)
                into.append(time.perf_counter() - start)
    return min(with_git), min(without)


def on_host(directory: Path) -> float:
    start = time.perf_counter()
    subprocess.run(TEST.replace("python ", f"{sys.executable} ", 1), shell=True, cwd=directory,
                   check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", default="more-itertools==10.5.0")
    parser.add_argument("--allow", action="append", default=[], metavar="NET",
                        help="give the runs --setup-allow-address NET (a network whose "
                             "resolver answers in a reserved range)")
    args = parser.parse_args()
    ALLOW.extend(args.allow)
    with tempfile.TemporaryDirectory(prefix="retcon-bench-setup-") as tmp:
        source = fetch(args.project, Path(tmp) / "sdist")
        directory = Path(tmp) / "repo"
        repo = make_repo(source, directory)
        with_git, without_git = git_metadata(repo, directory / "bench-spec.toml")
        cold_wall, cold = verify(directory, cold=True)
        warm_wall, warm = verify(directory, cold=False)
        if "setup" in warm:
            sys.exit("the warm verification prepared its environment again")
        _, cached = verify(directory, True)  # a second setup, from the package cache
        _, uncached = verify(directory, True, "--no-package-cache")
        host = min(on_host(source) for _ in range(3))
        subprocess.run(["docker", "image", "rm", *PREPARED], check=False, capture_output=True)
    print(f"{args.project}: setup `pip install -r requirements.txt` (pytest>=8), test `{TEST}`")
    print(f"  {'verify, one commit (tests run)':<44} {'setup cached':>13} {warm_wall:6.2f} s   "
          f"{'cold setup':>11} {cold_wall:6.2f} s   ({cold_wall / warm_wall:.1f}x)")
    print(f"  {'of which setup (pip, through the proxy)':<44} {'':>13} {'':>8}   "
          f"{'':>11} {cold.get('setup', 0):6.2f} s")
    sandboxed = warm.get("test", 0.0)
    print(f"  {'the test suite alone':<44} {'in sandbox':>13} {sandboxed:6.2f} s   "
          f"{'on host':>11} {host:6.2f} s   ({sandboxed - host:+.2f} s)")
    print(f"  {'the whole verification (container included)':<44} {'in sandbox':>13} "
          f"{warm_wall:6.2f} s   {'on host':>11} {host:6.2f} s")
    print(f"  {'preparing a sandbox workspace':<44} {'git metadata':>13} {with_git:6.2f} s   "
          f"{'without':>11} {without_git:6.2f} s   ({with_git - without_git:+.2f} s)")
    print(f"  {'second setup, same inputs':<44} {'package cache':>13} "
          f"{cached.get('setup', 0):6.2f} s   {'without':>11} {uncached.get('setup', 0):6.2f} s")
    print(f"  {'  pip: files taken from its cache/downloaded':<44} {'package cache':>13} "
          f"{cached.get('cached', 0):3.0f}/{cached.get('downloaded', 0):<3.0f}    "
          f"{'without':>11} {uncached.get('cached', 0):3.0f}/{uncached.get('downloaded', 0):.0f}")
    first, second = uncached.get("bytes", 0), cached.get("bytes", 0)
    print(f"  {'  bytes in through the egress proxy':<44} {'package cache':>13} "
          f"{second / 1e6:6.2f} MB {'without':>11} {first / 1e6:6.2f} MB   "
          f"({second / first if first else 0:.0%})")


if __name__ == "__main__":
    main()
