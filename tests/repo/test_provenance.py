"""Provenance: every run names, per commit, the paths given content found in neither the base
nor the source; --strict-provenance stops at such a commit until a human resolves it."""

from __future__ import annotations

import json
from pathlib import Path

from retcon_sandbox.repo.gitrepo import TreeEntry
from retcon_sandbox.repo.provenance import PREFIX, Provenance, classify, gate
from tests.conftest import cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Step, call
from tests.scripts import reconstruction, write

LOCAL = ("--sandbox", "local", "--non-interactive")
A, B, C = TreeEntry("100644", "a" * 40), TreeEntry("100644", "b" * 40), TreeEntry("100644",
                                                                                    "c" * 40)
PWN = ".github/workflows/pwn.yml"


def test_classify() -> None:
    base = {"kept": A, "changed": A, "removed": A}
    source = {"kept": A, "changed": B, "added": B}
    found = classify([("changed", C), ("added", B), ("removed", None), ("kept", A),
                      ("planted", C), ("changed2", None)], base, source)
    assert found == Provenance(("changed", "planted"), ("planted",))


def test_gate() -> None:
    found = Provenance(("x",), ())
    assert gate(found, strict=False, stuck=None, note=None) is None
    assert gate(Provenance(), strict=True, stuck=None, note=None) is None
    summary = gate(found, strict=True, stuck=None, note=None)
    assert summary is not None and summary.startswith(PREFIX) and "x" in summary
    assert gate(found, strict=True, stuck=summary, note=None) is not None
    assert gate(found, strict=True, stuck=summary, note="checked, fine") is None
    assert gate(found, strict=True, stuck="the build fails", note="fixed") is not None


def injected() -> list[Step]:
    """The reconstruction, but commit 1 plants a workflow that commit 4 removes again."""
    script = reconstruction()
    first, last = script[4], script[-1]
    assert isinstance(first, list) and isinstance(last, list)
    script[4] = [write(PWN, "on: push\n"), *first]
    script[-1] = [call("delete_file", path=PWN), *last]
    return script


def test_a_planted_file_is_reported_though_the_trees_match(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    assert next(e for e in events if e["event"] == "tree_check")["equal"] is True
    origins = {o["number"]: o for o in next(e for e in events
                                            if e["event"] == "summary")["provenance"]}
    assert PWN in origins[1]["novel"] and origins[1]["foreign"] == [PWN]
    assert PWN not in origins.get(4, {"novel": []})["novel"]  # a deletion back to the base


def test_the_human_summary_marks_it(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    line = next(x for x in result.out.splitlines() if "#1 " in x and "neither" in x)
    assert f"⚠ {PWN}" in line
    assert "check them before you push" in result.out


def test_strict_provenance_stops_until_resolved(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()[:5]) as model:
        stopped = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                      env=llm_env(model.base_url))
    assert stopped.code == 3, stopped.out + stopped.err
    text = demo.spec.read_text()
    assert f'stuck = "{PREFIX} --strict-provenance' in text and PWN in text
    assert "complete" not in text.split("[[commit]]")[1]

