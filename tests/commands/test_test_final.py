"""`[sandbox] test_final`: each commit runs the lighter `test`, the finished branch and `verify`
run `test_final`; the cache keeps the two commands' results apart. Real CLI, real repositories,
the local backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.spec.settings import SandboxSettings, final_test
from retcon_sandbox.verify.cache import Cache, Key, Outcome, Stage
from tests.conftest import Demo, cli, make_demo

pytestmark = pytest.mark.slow  # whole runs of the command line

LOCAL = ("--sandbox", "local", "--non-interactive")
TEST = 'test = "python3 -m pytest -q -p no:cacheprovider"\n'


def demo_with(tmp_path: Path, test_final: str) -> Demo:
    text = demo_project.spec_text(True).replace(TEST, TEST + f"test_final = {test_final!r}\n")
    assert "test_final" in text
    return make_demo(tmp_path / "repo", with_paths=True, spec_text=text)


def events(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_the_setting_parses_like_test_and_falls_back_to_it() -> None:
    both = SandboxSettings.parse({"test": "pytest -x tests/unit", "test_final": "pytest"})
    assert final_test(both) == "pytest" and both.test == "pytest -x tests/unit"
    assert final_test(SandboxSettings.parse({"test": "pytest"})) == "pytest"
    assert final_test(both, test_override="make check") == "pytest -x tests/unit"
    for bad in ("", 3, "a\0b"):
        try:
            SandboxSettings.parse({"test_final": bad})
        except ValueError as exc:
            assert exc.args[0] == "test_final"
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_a_final_test_that_fails_on_the_finished_tree_is_reported_there(tmp_path: Path) -> None:
    """Every commit passes `test`; `test_final` fails only on the last tree (the docs commit
    adds docs/discounts.md): the failure is the final tree's, exit 3, the branch complete."""
    demo = demo_with(tmp_path, "test ! -f docs/discounts.md")
    result = cli("execute", str(demo.spec), *LOCAL, "--json")
    assert result.code == 3, result.out + result.err
    found = events(result.out)
    final = [e for e in found if e["event"] == "final_tree"]
    assert len(final) == 1 and final[0]["passed"] is False
    assert final[0]["tree"] == demo.git("rev-parse", "feature^{tree}")
    assert final[0]["command"] == "test ! -f docs/discounts.md"
    assert isinstance(final[0]["tail"], str)
    assert all(isinstance(e["number"], int) for e in found if e["event"] == "failure_output")
    assert all(e["verdict"] == "PASS" for e in found if e["event"] == "tests")
    (summary,) = [e for e in found if e["event"] == "summary"]
    tests = summary["tests"]
    assert isinstance(tests, dict)
    assert tests["each_commit"] == {"command": "python3 -m pytest -q -p no:cacheprovider",
                                    "trees": 4}
    assert tests["final"]["passed"] is False and tests["final"]["verdict"] == "FAIL (exit 1)"
    assert len(demo.git("log", "--format=%s", "main..feature-clean").splitlines()) == 4
    summary_file = tmp_path / "summary.md"
    # the cached failure is reported again
    again = cli("execute", str(demo.spec), *LOCAL, "--summary", str(summary_file))
    assert again.code == 3, again.out + again.err
    assert ("Tests: 0 commit trees ran `python3 -m pytest -q -p no:cacheprovider`, the final "
            "tree ran `test ! -f docs/discounts.md` (FAIL (exit 1), cached)") in again.out
    assert "fails the final tests" in again.out
    assert "Final tree " in again.out and ": FAIL (exit 1) (cached)" in again.out
    # a run that exits 3 never says Complete!, and --json's summary says so too
    assert "Complete!" not in again.out + result.out
    assert "Finished, but not complete (exit 3): see below." in again.out
    assert (summary["complete"], summary["exit_code"]) == (False, 3)
    assert "✗ Finished, but not complete: exit 3 (4 of 4 logical commits" in \
        summary_file.read_text(encoding="utf-8")


def test_each_commit_runs_test_and_verify_runs_test_final(tmp_path: Path) -> None:
    """`test_final` passes only on the last tree: execute succeeds (so the commits ran `test`);
    verify runs `test_final` on every commit, reusing only the final tree's cached result."""
    demo = demo_with(tmp_path, "test -f docs/discounts.md")
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert ("Tests: 4 commit trees ran `python3 -m pytest -q -p no:cacheprovider`, the final "
            "tree ran `test -f docs/discounts.md` (PASS)") in result.out
    verified = cli("verify", str(demo.spec), "--sandbox", "local", "--json")
    assert verified.code == 3, verified.out + verified.err
    rows = [e for e in events(verified.out) if e["event"] == "commit_verified"]
    assert [(r["passed"], r["cached"]) for r in sorted(rows, key=lambda r: str(r["number"]))] \
        == [(False, False)] * 3 + [(True, True)]
    (start,) = [e for e in events(verified.out) if e["event"] == "verify_start"]
    assert start["build"] == "python3 -m compileall -q shop tests"
    assert start["test"] == "test -f docs/discounts.md"
    plain = cli("verify", str(demo.spec), "--sandbox", "local",
                "--test", "python3 -m pytest -q -p no:cacheprovider")
    assert plain.code == 0, plain.out + plain.err  # --test wins; its results are cached
    assert "4 commits: 4 passed (4 cached)" in plain.out
    assert "test `python3 -m pytest -q -p no:cacheprovider`\n" in plain.out


def test_results_under_test_and_test_final_never_stand_for_each_other(tmp_path: Path) -> None:
    from retcon_sandbox.repo.gitrepo import Repo
    repo = Repo.init(tmp_path / "r")
    tree = repo.tree_of(repo.commit_files("main", {"a.txt": "a\n"}, "one"))
    light, full = Key("make", "pytest -x unit", "env"), Key("make", "pytest", "env")
    passed = Outcome((Stage("build", "make", "PASS", True, False, 1.0),
                      Stage("test", "pytest -x unit", "PASS", True, False, 1.0)), None, "", 600)
    failed = Outcome((Stage("build", "make", "PASS", True, False, 1.0),
                      Stage("test", "pytest", "FAIL (exit 1)", False, False, 1.0)),
                     "Tests FAIL (exit 1)", "boom", 600)
    Cache(repo).put(tree, light, passed)
    assert Cache(repo).get(tree, full, 600) is None
    Cache(repo).put(tree, full, failed)
    got_light, got_full = Cache(repo).get(tree, light, 600), Cache(repo).get(tree, full, 600)
    assert got_light is not None and got_light.passed
    assert got_full is not None and not got_full.passed and got_full.tail == "boom"


def test_skipping_the_tests_skips_the_final_tests_too(tmp_path: Path) -> None:
    demo = demo_with(tmp_path, "false")
    result = cli("execute", str(demo.spec), *LOCAL, "--skip", "test", "--json")
    assert result.code == 0, result.out + result.err
    found = events(result.out)
    assert not [e for e in found if e["event"] in ("final_verify", "final_tree")]
    (summary,) = [e for e in found if e["event"] == "summary"]
    assert summary["tests"] is None
