"""The pipelined reconstruction against the serial one, side by side, in one run.

    python3 bench/pipeline.py [--commits 6] [--latency 2] [--test-seconds 2] [--sandbox docker]

A repository of COMMITS logical commits, each one file the model extracts with one answer;
the model is the fake Chat Completions server (tests/fake_openai.py) answering after LATENCY
seconds; the test command sleeps TEST_SECONDS. The same spec runs `execute --no-pipeline`,
`execute` (the default: the next sandbox pre-warmed) and `execute --pipeline` (in this
process, so that the bench can time the sandbox operations and the model calls), and prints:

- wall times and their ratio;
- the visible per-commit sandbox overhead: from "commit k done" to the first sandbox operation
  of commit k+1 (a tool call or a command), less the time spent waiting for the model in
  between: what stands between two commits on the critical path;
- then the same with a commit that needs a `fixup!` (commit 3's first version fails its test):
  whether the spec's text and the cleaned branch (shas, trees, messages) are identical.

Nothing is asserted: these are figures to read (on a shared machine, inflated by its load).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retcon_sandbox import cli
from retcon_sandbox.backends.api import HelperSandbox
from retcon_sandbox.backends.docker.sandboxes import DockerSandbox
from retcon_sandbox.model.llm import OpenAIChat
from tests.fake_openai import FakeOpenAI, Step, call

DATES = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
         "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
         "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}
FIXED = 3  # the commit whose first version fails, in the fix case


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={**os.environ, **DATES}).stdout.strip()


def content(number: int, broken: bool = False) -> str:
    return f"VALUE_{number} = {number}\n" + ("BROKEN = True\n" if broken else "")


def make_repo(root: Path, commits: int, test_seconds: float) -> Path:
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("bench\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(root, "checkout", "-q", "-b", "feature")
    for n in range(1, commits + 1):
        (root / f"mod{n}.py").write_text(content(n))
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"wip {n}")
    git(root, "checkout", "-q", "main")
    parts = ['source = "feature"\nremote = "main"\ncleaned = "feature-clean"\n\n[sandbox]\n'
             f'test = "sleep {test_seconds} && ! grep -qs BROKEN *.py"\n']
    for n in range(1, commits + 1):
        parts.append(f'\n[[commit]]\nmessage = "add mod{n}"\nhints = "mod{n}.py only"\n')
    spec = root / "history-spec.toml"
    spec.write_text("".join(parts))
    return spec


def responder(fix: bool) -> Callable[[dict[str, Any]], Step]:
    """Each answer from the request itself, so that asking ahead or again changes nothing."""

    def respond(body: dict[str, Any]) -> Step:
        messages = body["messages"]
        task = str(messages[1]["content"])
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        found = re.match(r"Commit (\d+) of", task)
        assert found
        number = int(found.group(1))
        if turn:
            return [call("create_commit", message="m")]
        fixing = "does not pass yet" in task.split("\n", 1)[0]
        broken = fix and number == FIXED and not fixing
        return [call("write_file", path=f"mod{number}.py", content=content(number, broken)),
                call("create_commit", message="m")]

    return respond


class Timeline:
    """When the sandbox was used and when the model was waited for (timing only)."""

    def __init__(self) -> None:
        self.ops: list[float] = []
        self.model: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        originals = {(cls, name): getattr(cls, name) for cls, name in
                     ((HelperSandbox, "write_file"), (HelperSandbox, "run"),
                      (DockerSandbox, "run"))}
        complete = OpenAIChat.complete

        def timed_op(original: Any) -> Any:
            def op(box: Any, *args: Any, **kwargs: Any) -> Any:
                with self._lock:
                    self.ops.append(time.time())
                return original(box, *args, **kwargs)
            return op

        def timed_complete(model: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return complete(model, *args, **kwargs)
            finally:
                with self._lock:
                    self.model.append((start, time.time()))

        for (cls, name), original in originals.items():
            setattr(cls, name, timed_op(original))
        OpenAIChat.complete = timed_complete  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            for (cls, name), original in originals.items():
                setattr(cls, name, original)
            OpenAIChat.complete = complete  # type: ignore[method-assign]

    def visible(self, done: float) -> float | None:
        """From `done` to the next sandbox operation, less the model's time in between."""
        later = [t for t in self.ops if t >= done]
        if not later:
            return None
        first = min(later)
        waited = sum(max(0.0, min(end, first) - max(start, done)) for start, end in self.model)
        return first - done - waited


Events = list[dict[str, Any]]


MODES = {"serial": ("--no-pipeline",), "warm": (), "pipelined": ("--pipeline",)}


def execute(spec: Path, sandbox: str, mode: str, url: str) -> tuple[float, Events, Timeline]:
    argv = ["execute", str(spec), "--repo", str(spec.parent), "--json", "--no-cache",
            "--non-interactive", "--skip", "build", "--sandbox", sandbox, *MODES[mode]]
    os.environ.update({"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "bench",
                       "RETCON_SANDBOX_MODEL": "fake-model", **DATES})
    timeline = Timeline()
    out = io.StringIO()
    start = time.monotonic()
    with timeline.installed(), contextlib.redirect_stdout(out):
        try:
            cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    wall = time.monotonic() - start
    events = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    if code != 0:
        raise SystemExit(f"the run failed ({code}): {out.getvalue()[-2000:]}")
    return wall, events, timeline


def overhead(events: list[dict[str, Any]], timeline: Timeline) -> list[float]:
    done = [e["time"] for e in events if e["event"] == "commit_complete"]
    return [v for t in done[:-1] if (v := timeline.visible(t)) is not None]


def handover(events: list[dict[str, Any]]) -> list[float]:
    """From "commit k done" to commit k+1's start: the previous sandbox's removal, when it is
    waited for."""
    done = {e["number"]: e["time"] for e in events if e["event"] == "commit_complete"}
    start = {e["number"]: e["time"] for e in events if e["event"] in ("commit_start", "resume")}
    return [start[n + 1] - t for n, t in done.items() if n + 1 in start]


def reset(spec: Path, text: str) -> None:
    git(spec.parent, "branch", "-D", "feature-clean")
    spec.write_text(text)


def branch(repo: Path) -> str:
    return git(repo, "log", "--format=%H %T %s", "main..feature-clean")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=6)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model answer")
    parser.add_argument("--test-seconds", type=float, default=2.0)
    parser.add_argument("--sandbox", default="docker", choices=("docker", "local"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="retcon-bench-pipeline-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        spec = make_repo(root, args.commits, args.test_seconds)
        original = spec.read_text()
        print(f"{args.commits} commits, model latency L = {args.latency} s per answer (one "
              f"answer per commit), tests T = {args.test_seconds} s, sandbox {args.sandbox}; "
              "a shared machine: figures are inflated by its load\n")
        results = {}
        for fix in (False, True):
            with FakeOpenAI([], respond=responder(fix), latency=args.latency) as model:
                for mode in MODES:
                    wall, events, timeline = execute(spec, args.sandbox, mode, model.base_url)
                    results[fix, mode] = (wall, events, timeline, spec.read_text(),
                                          branch(root))
                    reset(spec, original)
        report(results)


Result = tuple[float, Events, Timeline, str, str]


def report(results: dict[tuple[bool, str], Result]) -> None:
    def row(what: str, cell: Callable[[Result], str], fix: bool = False) -> None:
        print(f"  {what:<44}" + "".join(f" {cell(results[fix, m]):>14}" for m in MODES))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    serial = results[False, "serial"][0]
    fserial = results[True, "serial"][0]
    print(f"  {'':<44}" + "".join(f" {m:>14}" for m in MODES))
    print(f"  {'':<44}" + "".join(f" {a:>14}" for a in ("--no-pipeline", "(default)",
                                                         "--pipeline")))
    row("wall time, no fix", lambda r: f"{r[0]:.2f} s")
    row("ratio to serial", lambda r: f"{r[0] / serial:.2f}")
    row("visible overhead per commit, mean",
        lambda r: f"{mean(overhead(r[1], r[2])) * 1000:.0f} ms")
    row("visible overhead per commit, max",
        lambda r: f"{max(overhead(r[1], r[2]) or [0]) * 1000:.0f} ms")
    row("  of which: k done -> k+1 starts, mean", lambda r: f"{mean(handover(r[1])) * 1000:.0f} ms")
    row("begun ahead: kept / begun", lambda r: "{} / {}".format(
        *(lambda k: (sum(k), len(k)))([e["kept"] for e in r[1] if e["event"] == "speculation"])))
    row("wall time, commit 3 needs a fixup!", lambda r: f"{r[0]:.2f} s", fix=True)
    row("ratio to serial (fix)", lambda r: f"{r[0] / fserial:.2f}", fix=True)
    row("tokens, speculative & discarded (fix)", lambda r: str(next(
        e for e in r[1] if e["event"] == "summary")["tokens"].get("speculative, discarded", 0)),
        fix=True)
    for fix in (False, True):
        reference = results[fix, "serial"]
        same = {m: (results[fix, m][3] == reference[3], results[fix, m][4] == reference[4])
                for m in MODES if m != "serial"}
        what = "with a fix" if fix else "no fix"
        print(f"  {what}: identical to serial (spec history, commits and trees): " +
              ", ".join(f"{m} {h and b}" for m, (h, b) in same.items()))

if __name__ == "__main__":
    main()
