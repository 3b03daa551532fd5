"""`[sandbox] test_final` in containers: each commit runs `test`, the finished tree runs
`test_final`, and a final failure is the final tree's (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import cli, make_demo
from tests.docker.conftest import ours

TEST = 'test = "python3 -m pytest -q -p no:cacheprovider"\n'


def test_the_final_tree_runs_test_final_in_a_container(engine: DockerEngine,
                                                       tmp_path: Path) -> None:
    text = demo_project.spec_text(True).replace(
        TEST, TEST + "test_final = \"test ! -f docs/discounts.md && python3 -m pytest -q -p "
        "no:cacheprovider\"\n")
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    result = cli("execute", str(demo.spec), "--non-interactive", "--json")
    assert result.code == 3, result.out + result.err
    found = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    assert all(e["verdict"] == "PASS" for e in found if e["event"] == "tests")
    (final,) = [e for e in found if e["event"] == "final_tree"]
    assert final["passed"] is False and final["verdict"] == "FAIL (exit 1)"
    assert final["tree"] == demo.git("rev-parse", "feature^{tree}")
    (summary,) = [e for e in found if e["event"] == "summary"]
    assert summary["tests"]["each_commit"]["trees"] == 4
    assert ours(engine, tmp_path) == []  # the final check's container is gone too
