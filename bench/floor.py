"""`execute`'s wall time against its floor, on real ranges, with a zero-latency model.

    python3 bench/floor.py [--only NAME ...] [--mirrors /work/.mirror] [--keep]

The floor is what a person would wait for by hand: each commit's own build and test time (the
`seconds` of its `build` and `tests` events, measured in the sandbox) plus the commands of the
setups that are needed (`setup_ready`'s `commands`). Each range is a real repository's
first-parent commits (from a clone or bare mirror under --mirrors: fetch them first); the spec
has one logical commit per original commit, and the model (tests/fake_openai.py, answering at
once) writes exactly that commit's files, so every tree is the original's. `execute --no-cache`
runs through the real command line, so nothing is cached and every environment is prepared
once. Printed per range: the wall time, the floor (commands, setups), their ratio (the target
is at most 1.15), and where the rest went: sandboxes waited for (`sandbox` events of commits not
opened ahead), setups beyond their commands (of which the engine's commit of each environment
as an image: on fuse-overlayfs it walks the whole filesystem), and the remainder (the model's
turns, git, start-up). With --against, each range runs again right after with another
checkout's code (e.g. main's), back to back on the same load (a version whose `setup_ready` does
not say how long the commands took has it read from its `setup_command` and `setup_output`
events' times). The machine's load is printed with each: on a shared machine the ratio is
inflated by it. The modules' bytecode is kept, as in an install (bench/against.py's
`as_installed`), even where PYTHONDONTWRITEBYTECODE is set. Nothing is asserted: these are
figures to read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from against import as_installed, python_path  # bench/against.py, beside this script

from tests.fake_openai import FakeOpenAI, Step, call

PYTEST = "python -m pytest -q -p no:cacheprovider"


@dataclass(frozen=True)
class Case:
    name: str
    repository: str  # OWNER+NAME under --mirrors
    base: str
    tip: str
    test: str
    setup: str | None = None
    build: str | None = None
    image: str | None = None
    timeout: int = 600


CASES = [
    Case("boltons", "mahmoud+boltons", "HEAD~6", "HEAD", f"{PYTEST} tests"),
    Case("more-itertools", "more-itertools+more-itertools", "HEAD~3", "HEAD",
         f"{PYTEST} tests"),
    Case("humanize", "python-humanize+humanize", "976484a", "3c577d7",
         f"{PYTEST} tests", setup="pip install -e .[tests]"),
    Case("hexyl", "sharkdp+hexyl", "ad553e9", "f2547ae", "cargo test --offline -q",
         setup="cargo fetch", build="cargo build --offline -q --all-targets",
         image="retcon-sandbox/rust", timeout=1800),
]
DATES = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
         "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}


def git(repo: Path, *args: str, data: bool = False) -> Any:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                         env={**os.environ, **DATES}).stdout
    return out if data else out.decode().strip()


@dataclass(frozen=True)
class Original:
    """One commit of the range: its subject and the files it changed (None: deleted)."""

    subject: str
    files: dict[str, str | None]


def make_repo(case: Case, mirrors: Path, root: Path) -> tuple[Path, list[Original]]:
    """A clone with `main` at the range's base and `feature` at its tip, and a spec of one
    logical commit per original commit; the originals, as the model will write them."""
    source = mirrors / case.repository / "repo"
    source = source if source.exists() else mirrors / case.repository
    root.mkdir(parents=True, exist_ok=True)
    repo = root / case.name
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(source), str(repo)], check=True)
    base, tip = git(repo, "rev-parse", case.base), git(repo, "rev-parse", case.tip)
    git(repo, "update-ref", "refs/heads/main", base)
    git(repo, "update-ref", "refs/heads/feature", tip)
    git(repo, "symbolic-ref", "HEAD", "refs/heads/main")
    originals = []
    for commit in git(repo, "rev-list", "--reverse", "--first-parent", f"{base}..{tip}").split():
        files: dict[str, str | None] = {}
        for line in git(repo, "diff", "--name-status", "--no-renames", f"{commit}^", commit,
                        ).splitlines():
            status, path = line.split("\t", 1)
            files[path] = None if status == "D" else \
                git(repo, "show", f"{commit}:{path}", data=True).decode("utf-8")
        originals.append(Original(git(repo, "log", "-1", "--format=%s", commit), files))
    sandbox = [f"test = {json.dumps(case.test)}"]
    sandbox += [f"setup = {json.dumps(case.setup)}"] if case.setup else []
    sandbox += [f"build = {json.dumps(case.build)}"] if case.build else []
    sandbox += [f"image = {json.dumps(case.image)}"] if case.image else []
    text = ('source = "feature"\nremote = "main"\ncleaned = "feature-clean"\n\n[sandbox]\n'
            + "\n".join(sandbox) + "\n")
    for n, original in enumerate(originals, 1):
        text += f"\n[[commit]]\nmessage = {json.dumps(original.subject)}\nhints = \"#{n}\"\n"
    (repo.parent / f"{case.name}.toml").write_text(text)
    return repo, originals


def responder(originals: list[Original]) -> Any:
    def respond(body: dict[str, Any]) -> Step:
        messages = body["messages"]
        task = str(messages[1]["content"])
        if any(m.get("role") == "assistant" for m in messages):
            return [call("create_commit", message="as the original")]
        number = int(task.split("Commit ", 1)[1].split(" of", 1)[0])
        if "does not pass yet" in task.split("\n", 1)[0]:
            return [call("report_stuck", summary="the original commit fails its tests")]
        writes = [call("delete_file", path=path) if text is None else
                  call("write_file", path=path, content=text)
                  for path, text in originals[number - 1].files.items()]
        return [*writes, call("create_commit", message="as the original")]
    return respond


def commands_of(events: list[dict[str, Any]], ready: dict[str, Any]) -> float:
    """A setup's commands' time, from its events: its first `setup_command` to its last
    `setup_output` (before `ready`)."""
    before = [e for e in events if e["time"] <= ready["time"]]
    start = max(i for i, e in enumerate(before) if e["event"] == "setup")
    mine = [e for e in before[start:] if e["event"] in ("setup_command", "setup_output")]
    return float(mine[-1]["time"] - mine[0]["time"]) if mine else 0.0


ALLOW: list[str] = []  # --setup-allow-address NET for every run (--allow)


def measure(case: Case, mirrors: Path, work: Path, runner: Path | None = None,
            label: str = "") -> None:
    """One range through `execute`; `runner`: another checkout's `runner/` to run instead."""
    repo, originals = make_repo(case, mirrors, work / (label or "this"))
    load = os.getloadavg()[0]
    with FakeOpenAI([], respond=responder(originals)) as model:
        path = {"PYTHONPATH": str(runner)} if runner is not None else {}
        env = {**as_installed({**os.environ, **path}),
               **DATES, "OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "bench",
               "RETCON_SANDBOX_MODEL": "fake-model"}
        started, started_at = time.monotonic(), time.time()
        proc = subprocess.run([sys.executable, "-m", "retcon_sandbox", "execute",
                               str(repo.parent / f"{case.name}.toml"), "--repo", str(repo),
                               "--json",
                               "--no-cache", "--non-interactive", "--timeout",
                               str(case.timeout), *([] if case.build else ["--skip", "build"]),
                               *(a for net in ALLOW for a in ("--setup-allow-address", net))],
                              env=env, capture_output=True, text=True)
        wall, ended_at = time.monotonic() - started, time.time()
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    (repo.parent / f"{case.name}.events.jsonl").write_text(proc.stdout)
    if proc.returncode != 0:
        print(f"{case.name}: execute exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
              f"{proc.stderr[-2000:]}")
        return
    commands = sum(float(e.get("seconds", 0)) for e in events
                   if e["event"] in ("build", "tests") and "seconds" in e)
    ready = [e for e in events if e["event"] == "setup_ready"]
    for e in ready:  # this bench's environments go (its clones are never run again)
        subprocess.run(["docker", "rmi", "-f", str(e["tag"])], capture_output=True)
    setups = sum(float(e["commands"]) if "commands" in e else commands_of(events, e)
                 for e in ready)
    setup_all = sum(float(e["seconds"]) for e in ready)
    ahead = {e["number"] for e in events if e["event"] == "speculation" and e["kept"]}
    sandboxes = sum(float(e["seconds"]) for e in events  # opened ahead: not waited for
                    if e["event"] == "sandbox" and e.get("number") not in ahead)
    floor = commands + setups
    rest = wall - floor - (setup_all - setups) - sandboxes
    start_up = float(events[0]["time"]) - started_at if events else 0.0
    shut_down = ended_at - float(events[-1]["time"]) if events else 0.0
    name = f"{case.name}{f' ({label})' if label else ''}"
    print(f"{name:24} {len(originals)} commits  wall {wall:7.1f} s  floor {floor:7.1f} s "
          f"(commands {commands:.1f}, {len(ready)} setups {setups:.1f})  ratio "
          f"{wall / floor if floor else float('nan'):5.2f}   load {load:.1f}")
    images = sum(float(e.get("image", 0)) for e in ready)
    print(f"{'':24} beyond the floor: setups' own steps {setup_all - setups:.1f} s (committing "
          f"images {images:.1f} s), sandboxes waited for {sandboxes:.1f} s, the rest {rest:.1f} s "
          f"(of which start-up {start_up:.1f} s, shut-down {shut_down:.1f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="the ranges to run (by name)")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--against", type=Path,
                        help="another checkout (e.g. /work/main): each range runs its code too, "
                        "right after this one's")
    parser.add_argument("--allow", action="append", default=[], metavar="NET",
                        help="give the runs --setup-allow-address NET (a network whose "
                        "resolver answers with documentation addresses)")
    args = parser.parse_args()
    ALLOW.extend(args.allow)
    work = Path(tempfile.mkdtemp(prefix="retcon-bench-floor-"))
    against = python_path(args.against.resolve()) if args.against is not None else None
    try:
        for case in CASES:
            if not args.only or case.name in args.only:
                measure(case, args.mirrors, work)
                if args.against is not None:
                    measure(case, args.mirrors, work, against, args.against.name)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
