"""What a CI log and a terminal show while a run works: a heartbeat line per long step off a
terminal, a live line on one, the phases' timings in --json, and nothing of it under --quiet
(which keeps the errors and the verdict, in every command). Heartbeats come every 0.1 s here
(RETCON_SANDBOX_HEARTBEAT) against steps made to last longer; nothing asserts a duration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from retcon_sandbox.report import CLEAR_LINE
from tests.conftest import Demo, cli, cli_on_a_terminal, llm_env, make_demo
from tests.fake_openai import FakeOpenAI
from tests.scripts import reconstruction

LOCAL = ("--sandbox", "local", "--non-interactive")
FAST_BEAT = {"RETCON_SANDBOX_HEARTBEAT": "0.1"}
SLOW_BUILD = ("--build", "sleep 0.5 && python3 -m compileall -q shop tests")
BEAT = re.compile(r"^  \.\.\. (#\d+ [0-9a-f]{7} )?(build|tests|model|sandbox|setup)\S*.*: \d+ s "
                  r"elapsed", re.MULTILINE)


@pytest.mark.slow
def test_verify_off_a_terminal_says_which_commit_and_phase_is_running(demo: Demo) -> None:
    args = ("verify", "main..feature~7", "--build", "sleep 0.5", "--sandbox", "local", "-j", "1")
    result = cli(*args, cwd=demo.path, env=FAST_BEAT)
    assert result.code == 0, result.out + result.err
    beats = re.findall(r"^  \.\.\. #(\d) ([0-9a-f]{7}) build: \d+ s elapsed$", result.out,
                       re.MULTILINE)
    shas = demo.git("log", "--reverse", "--format=%h", "--abbrev=7", "main..feature~7").split()
    assert beats and {sha for _, sha in beats} <= set(shas)
    assert all(shas[int(n) - 1] == sha for n, sha in beats)  # each names its own commit
    as_json = cli(*args, "--no-cache", "--json", cwd=demo.path, env=FAST_BEAT)
    events = [json.loads(line) for line in as_json.out.splitlines()]
    built = [e for e in events if e["event"] == "phase_end" and e["phase"] == "build"]
    assert sorted(e["number"] for e in built) == [1, 2, 3] and all(e["seconds"] for e in built)
    assert any(e["event"] == "heartbeat" and e["what"].endswith(" build") for e in events)
    quiet = cli(*args, "--no-cache", "-q", cwd=demo.path, env=FAST_BEAT)
    assert quiet.code == 0 and "elapsed" not in quiet.out
    assert quiet.out.strip() == "3 commits: 3 passed, in " + \
        quiet.out.strip().rsplit(" in ", 1)[1]


@pytest.mark.slow
def test_verify_quiet_prints_the_failures_and_the_verdict_only(demo: Demo) -> None:
    result = cli("verify", "-q", "main..feature", "--spec", str(demo.spec), "--sandbox", "local",
                 cwd=demo.path)
    assert result.code == 3, result.out + result.err
    lines = result.out.strip().splitlines()
    assert lines[0] == "Failures:"
    assert "Verifying" not in result.out and "commit   build" not in result.out
    assert "  #3 " in result.out and "  #5 " in result.out  # both failures, with their tails
    assert lines[-2].startswith("10 commits: 8 passed, 2 failed, in ")
    assert lines[-1].startswith("Exit 3: fix the failing commits")
    loud = cli("verify", "main..feature", "--spec", str(demo.spec), "--sandbox", "local",
               cwd=demo.path)
    assert len(loud.out.splitlines()) > len(result.out.splitlines()) + 10


@pytest.mark.slow
def test_execute_json_carries_each_phase_and_a_streaming_models_tokens(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction(), streams=True, chunk_delay=0.02) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json",
                     env={**llm_env(model.base_url), **FAST_BEAT})
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    ends = [e for e in events if e["event"] == "phase_end"]
    for name in ("sandbox", "model", "build", "tests"):
        timed = [e for e in ends if e["phase"] == name]
        assert timed and all(isinstance(e["seconds"], float | int) and e["seconds"] >= 0
                             for e in timed), name
        assert {e["number"] for e in timed if "number" in e} == {1, 2, 3, 4}, name
    assert any(e["phase"] == "model" and e.get("tokens", 0) > 0 for e in ends)
    starts = [e for e in events if e["event"] == "phase_start"]
    assert len(starts) == len(ends)
    beats = [e for e in events if e["event"] == "heartbeat"]
    assert any(b["phase"] == "model" and b.get("tokens") for b in beats), beats[:5]
    assert all(isinstance(b["seconds"], float | int) and b["what"] for b in beats)


@pytest.mark.slow
def test_execute_off_a_terminal_prints_heartbeats_and_quiet_prints_none(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    result = cli("execute", str(demo.spec), *LOCAL, *SLOW_BUILD, env=FAST_BEAT)
    assert result.code == 0, result.out + result.err
    assert re.search(r"^  \.\.\. #1 build: \d+ s elapsed$", result.out, re.MULTILINE)
    assert CLEAR_LINE not in result.out  # no live line off a terminal
    again = make_demo(tmp_path / "again", with_paths=True)
    quiet = cli("execute", str(again.spec), *LOCAL, *SLOW_BUILD, "-q", env=FAST_BEAT)
    assert quiet.code == 0 and not BEAT.search(quiet.out) and "Complete!" in quiet.out


@pytest.mark.slow
def test_execute_on_a_terminal_shows_a_live_line(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    result = cli_on_a_terminal("execute", str(demo.spec), *LOCAL, "--build",
                               "sleep 1.5 && python3 -m compileall -q shop tests", timeout=120)
    assert result.code == 0, result.out
    live = re.escape(CLEAR_LINE) + r"\.\.\. (#\d|base commit) (build|tests): \d+ s elapsed"
    assert re.search(live, result.out), result.out
    assert "Tree check: cleaned == source" in result.out
    assert "  ... #1 build" not in result.out.replace(CLEAR_LINE + "...", "")  # no plain lines


def test_plan_quiet_prints_the_spec_or_where_it_went(demo: Demo) -> None:
    to_stdout = cli("plan", "-q", "--source", "feature", cwd=demo.path)
    assert to_stdout.code == 0 and to_stdout.out.startswith("# Draft history spec")
    assert to_stdout.err == ""
    written = cli("plan", "-q", "--source", "feature", "-o", "draft.toml", cwd=demo.path)
    assert written.code == 0 and written.out == "Draft written: draft.toml\n"
