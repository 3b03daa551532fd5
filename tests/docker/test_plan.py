"""`plan` then `execute`: from a messy branch to a clean one in two commands, in real
containers; and the model's refinement, its file tools in a container, its proposal checked."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import cli, git, llm_env
from tests.fake_openai import FakeOpenAI, Step, call
from tests.plan.fixtures import CALC, DEMO, NOTES, Fixture


@pytest.mark.parametrize("fixture", [DEMO, CALC, NOTES], ids=lambda f: f.name)
def test_plan_then_execute_reaches_a_complete_run(engine: DockerEngine, fixture: Fixture,
                                                  tmp_path: Path) -> None:
    repo = tmp_path / fixture.name
    fixture.create(repo)
    planned = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=repo)
    assert planned.code == 0, planned.err
    spec = tomllib.loads((repo / "spec.toml").read_text(encoding="utf-8"))
    assert spec["sandbox"]["test"] == fixture.test  # guessed, and used as written
    result = cli("execute", "spec.toml", "--non-interactive", cwd=repo)
    assert result.code == 0, result.out + result.err
    assert "Tree check: cleaned == source ✓" in result.out
    assert "Remaining changes" not in result.out and "FAIL" not in result.out
    assert git(repo, "rev-parse", "feature-clean^{tree}") == git(repo, "rev-parse",
                                                                  "feature^{tree}")
    subjects = git(repo, "log", "--format=%s", "main..feature-clean").splitlines()
    assert subjects[::-1] == [c["message"].splitlines()[0] for c in spec["commit"]]


def test_the_model_refines_the_draft_through_tools_in_a_container(engine: DockerEngine,
                                                                  tmp_path: Path) -> None:
    repo = tmp_path / "calc"
    CALC.create(repo)
    git(repo, "checkout", "-q", "-f", "main")
    git(repo, "commit", "--allow-empty", "-q", "-m", "feat: an empty start")
    git(repo, "commit", "--allow-empty", "-q", "-m", "fix: nothing at all")
    git(repo, "commit", "--allow-empty", "-q", "-m", "docs: none either")
    script: list[Step] = [
        [call("read_file", path="calc/core.py"), call("list_files")],
        [call("propose_commit", message="refactor: move number parsing into calc/parser.py",
              paths=["calc/parser.py", "calc/core.py", "tests/test_parser.py"])],
        [call("propose_commit", message="feat: mean and spread", paths=["calc/stats.py",
                                                                        "calc/core.py"])],
        [call("propose_commit", message="feat: mean and spread",
              paths=["calc/stats.py", "nowhere.py"])],
        [call("propose_commit", message="feat: mean and spread",
              paths=["calc/stats.py", "tests/test_stats.py"])],
        [call("propose_commit", message="refactor: rename calc/util.py to calc/numbers.py",
              paths=["calc/util.py", "calc/numbers.py", "calc/format.py"])],
        [call("finish_plan")],
    ]
    with FakeOpenAI(script) as model:
        result = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=repo,
                     env=llm_env(model.base_url))
        results = model.tool_results()
        first = model.requests[0]
    assert result.code == 0, result.out + result.err
    # read_file answered from the container holding the base tree (the parser was not moved)
    assert "def parse_number" in results[0] and "calc/util.py" in results[1]
    assert "already placed" in results[3] and "calc/core.py (commit 1)" in results[3]
    assert "not files of the diff" in results[4]
    assert "feat: an empty start" in first["messages"][1]["content"]  # the remote's style
    assert {t["function"]["name"] for t in first["tools"]} == {
        "read_diff", "read_file", "list_files", "propose_commit", "finish_plan"}
    doc = tomllib.loads((repo / "spec.toml").read_text(encoding="utf-8"))
    messages = [c["message"] for c in doc["commit"]]
    assert messages[:3] == ["refactor: move number parsing into calc/parser.py",
                            "feat: mean and spread",
                            "refactor: rename calc/util.py to calc/numbers.py"]
    hints = doc["commit"][1]["hints"]  # README.md is shared with a later commit: a hints commit
    assert "calc/stats.py" in hints and "tests/test_stats.py" in hints and "README.md" in hints
    placed = [p for c in doc["commit"] for p in c.get("paths", [])]
    changed = git(repo, "diff", "--no-renames", "--name-only", "main", "feature").splitlines()
    assert len(placed) == len(set(placed)) and set(placed) <= set(changed)
    named = " ".join(c.get("hints", "") for c in doc["commit"])  # hints commits name the rest
    assert all(p in named for p in set(changed) - set(placed))
    assert "proposed by the model fake-model" in (repo / "spec.toml").read_text()
    assert "repaired: 2 file(s) it left out" in result.out  # the docs: README, docs/stats.md
    assert messages[3:] == ["docs: add docs/stats.md; update README.md"]  # the draft's
    assert cli("plan", "--check", "spec.toml", cwd=repo).code == 0


def test_a_proposal_that_places_nothing_is_refused_and_the_draft_written(
        engine: DockerEngine, tmp_path: Path) -> None:
    repo = tmp_path / "notes"
    NOTES.create(repo)
    with FakeOpenAI([[call("finish_plan")]]) as model:
        result = cli("plan", "--source", "feature", "-o", "spec.toml", "--json", cwd=repo,
                     env=llm_env(model.base_url))
    assert result.code == 0, result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    warnings = [e["message"] for e in events if e["event"] == "warning"]
    assert any("the model proposed no commit" in w for w in warnings)
    text = (repo / "spec.toml").read_text()
    assert "the model's proposal was refused" in text
    assert cli("plan", "--check", "spec.toml", cwd=repo).code == 0


def test_with_a_model_a_shared_file_makes_a_hints_commit_naming_its_part(
        engine: DockerEngine, tmp_path: Path) -> None:
    from tests.commands.test_plan import shared_change_log

    repo = shared_change_log(tmp_path / "r")
    with FakeOpenAI([[call("finish_plan")]]) as model:  # proposes nothing: the draft is kept
        result = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=repo,
                     env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    doc = tomllib.loads((repo / "spec.toml").read_text(encoding="utf-8"))
    for_model = [c for c in doc["commit"] if "paths" not in c]
    assert len(for_model) == 1
    hints = for_model[0]["hints"]
    assert "src/a.py" in hints and "From CHANGES.md, take only this part" in hints
    assert "+- faster a" in hints and "streaming b" not in hints
    assert any("CHANGES.md" in c.get("paths", ()) for c in doc["commit"])
    assert "is drafted for the model, which takes their part" in result.out
    checked = cli("plan", "--check", "spec.toml", cwd=repo)
    assert checked.code == 0, checked.out
