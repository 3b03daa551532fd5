"""An error's hint says truly what the run recorded in the spec before it stopped, at each
phase: before anything (preflight), and mid-history (a model that fails after a commit was
made). It used to say "nothing was recorded" wherever a setup or the base check failed."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.conftest import cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Fault
from tests.scripts import stuck_then_fixed

LOCAL = ("--sandbox", "local", "--non-interactive", "--json")


def error_of(out: str) -> dict[str, object]:
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(e for e in events if e["event"] == "error")


@pytest.mark.slow
def test_a_run_stopped_before_anything_says_it_recorded_nothing(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    before = demo.spec.read_bytes()
    result = cli("execute", str(demo.spec), *LOCAL, "--build", "./no-such-build")
    assert result.code == 1, result.out + result.err
    assert str(error_of(result.out)["hint"]).endswith(
        "This run recorded nothing in history-spec.toml.")
    assert demo.spec.read_bytes() == before


@pytest.mark.slow
def test_a_run_stopped_mid_history_says_what_it_recorded(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    first_commit = stuck_then_fixed()[0][0]
    with FakeOpenAI([first_commit, Fault(401, "bad key")]) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 1, result.out + result.err
    histories = [c.get("history", []) for c in tomllib.loads(demo.spec.read_text())["commit"]]
    assert [len(h) for h in histories] == [3, 1, 0, 0], histories  # #1 done, #2 started
    assert str(error_of(result.out)["hint"]).endswith(
        "This run recorded 4 history entries in history-spec.toml (commit #1 to #2; 1 "
        "commit(s) made on feature-clean): they are kept, and a rerun goes on from them.")
