"""`execute --pipeline` against the serial run, through the local backend: the same spec
history (byte for byte), the same commits and trees, including when a commit needs a fix (then
the next commit's speculation is discarded), and a stop while speculating resumes like a serial
run. The model answers from each request, not from the order of the requests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, NEUTRAL, Demo, cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Hang, Step
from tests.scripts import by_request

pytestmark = pytest.mark.slow  # whole runs of the command line

LOCAL = ("--sandbox", "local", "--non-interactive", "--no-cache")
DOCKER = ("--non-interactive", "--no-cache")
DATES = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def run(demo: Demo, respond: Any, *flags: str, where: tuple[str, ...] = LOCAL
        ) -> tuple[str, str, list[dict[str, Any]]]:
    """One run from scratch: the spec's text, the cleaned branch (sha, tree, message of each
    commit), and the --json events."""
    with FakeOpenAI([], respond=respond) as model:
        result = cli("execute", str(demo.spec), *where, "--json", *flags,
                     env={**llm_env(model.base_url), **DATES})
    assert result.code == 0, result.out + result.err
    return demo.spec.read_text(), branch(demo), [json.loads(line) for line in
                                                 result.out.splitlines()]


def branch(demo: Demo) -> str:
    return demo.git("log", "--format=%H %T %B", "main..feature-clean")


def reset(demo: Demo, original: str) -> None:
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(original)


def speculations(events: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    return [(e["number"], e["kept"]) for e in events if e["event"] == "speculation"]


def test_pipelined_history_commits_and_trees_are_the_serial_runs_with_a_fix(
        tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    serial_spec, serial_branch, serial_events = run(demo, by_request(), "--no-pipeline")
    assert speculations(serial_events) == []
    reset(demo, original)
    spec, cleaned, events = run(demo, by_request(), "--pipeline")
    assert spec == serial_spec
    assert cleaned == serial_branch
    assert "fixup! feat: discount codes" in cleaned
    # 3 was begun on 2's first tree, which needed a fix: discarded, begun again on the fixed one
    assert speculations(events) == [(2, True), (3, False), (3, True), (4, True)]
    summary = next(e for e in events if e["event"] == "summary")
    assert summary["tokens"]["speculative, discarded"] > 0
    assert summary["tokens"]["3"] == next(
        e for e in serial_events if e["event"] == "summary")["tokens"]["3"]


def hang_at_3() -> Any:
    answer = by_request(needs_fix=False)

    def respond(body: dict[str, Any]) -> Step:
        return Hang() if "Commit 3 of" in str(body["messages"][1]["content"]) else answer(body)

    return respond


def stop_while_speculating(demo: Demo, where: tuple[str, ...]) -> None:
    """Run pipelined until the model is asked for commit 3 (ahead, while 2 builds and tests),
    then Ctrl-C: nothing of commit 3 is in the spec or on the branch."""
    errors = demo.spec.parent.parent / "stderr.txt"
    with FakeOpenAI([], respond=hang_at_3()) as model, errors.open("wb") as stderr:
        proc = subprocess.Popen(
            [*CLI, "execute", str(demo.spec), *where, "--pipeline"], cwd=NEUTRAL,
            env={**os.environ, **llm_env(model.base_url), **DATES, "PYTHONFAULTHANDLER": "1"},
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + 120
        while not any("Commit 3 of" in str(b["messages"][1]["content"]) for b in model.requests) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        tip = demo.git("rev-parse", "feature-clean")
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # where every thread is, for whoever reads the failure
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=30)
            pytest.fail("no exit within 60 s of Ctrl-C; its threads (faulthandler):\n"
                        + errors.read_text(errors="replace")[-8000:])
        assert code == 130, errors.read_text(errors="replace")
    assert demo.spec.read_text().count("commit_created") == 2  # nothing of commit 3
    assert demo.git("rev-parse", "feature-clean") == tip
    assert demo.git("log", "-1", "--format=%s", "feature-clean") == "feat: discount codes"


def test_a_stop_while_speculating_writes_nothing_of_it_and_resumes_like_a_serial_run(
        tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    serial_spec, serial_branch, _ = run(demo, by_request(needs_fix=False), "--no-pipeline")
    reset(demo, original)
    stop_while_speculating(demo, LOCAL)
    spec, cleaned, events = run(demo, by_request(needs_fix=False), "--pipeline")
    assert "resume" in {e["event"] for e in events}
    assert spec == serial_spec
    assert cleaned == serial_branch
