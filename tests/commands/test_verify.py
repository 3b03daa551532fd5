"""`retcon-sandbox verify` and the verification cache, end to end: the real CLI, real
repositories, the local backend (the Docker tier repeats the essentials in containers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import Demo, cli, cli_on_a_terminal, git, llm_env, make_demo
from tests.fake_openai import FakeOpenAI
from tests.scripts import reconstruction

LOCAL = ("--sandbox", "local")
MESSY = [m for m, _ in demo_project.MESSY]
# The messy branch's first five commits, "wip" (#3, does not build) and "tests" (#5, fails)
# among them: enough for what the cache, the notes' keys and the terminal do with a range.
FIRST_FIVE = "main..feature~5"


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by subject: [build, tests, time, cached?]."""
    found = {}
    table = out.split("  subject\n", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].isdigit() and len(parts[1]) == 7:
            subject_at = next(i for i, p in enumerate(parts)
                              if i > 4 and p not in ("yes", "claim"))
            found[" ".join(parts[subject_at:])] = parts[2:subject_at]
    return found


def redo(demo: Demo, original: str) -> None:
    """Forget the reconstruction: the cleaned branch and every history entry."""
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(original)


@pytest.mark.slow
def test_the_messy_branch_fails_where_it_is_broken_and_the_clean_one_passes(demo: Demo) -> None:
    messy = cli("verify", "main..feature", "--spec", str(demo.spec), "-j", "2", *LOCAL,
                cwd=demo.path)
    assert messy.code == 3, messy.out + messy.err
    table = rows(messy.out)
    assert sorted(table) == sorted(MESSY)  # in the order they finished
    assert table["wip"][:2] == ["FAIL", "-"]  # cart.py does not compile
    assert table["tests"][:2] == ["PASS", "FAIL"]  # SUMMER25 is tested before it exists
    assert all(table[m][:2] == ["PASS", "PASS"] for m in MESSY if m not in ("wip", "tests"))
    failures = messy.out.split("Failures:")[1]
    assert "#3" in failures and "SyntaxError" in failures  # the tail of each failure
    assert "#5" in failures and "KeyError: 'SUMMER25'" in failures
    assert "10 commits: 8 passed, 2 failed, in" in messy.out

    assert cli("execute", str(demo.spec), *LOCAL, "--non-interactive").code == 0
    clean = cli("verify", str(demo.spec), *LOCAL)
    assert clean.code == 0, clean.out + clean.err
    table = rows(clean.out)
    assert len(table) == 4 and all(cells[:2] == ["PASS", "PASS"] for cells in table.values())
    # execute verified these very trees: nothing ran again
    assert all(cells[-1] == "yes" for cells in table.values())
    assert "4 commits: 4 passed (4 cached)" in clean.out


@pytest.mark.slow
def test_json_has_one_event_per_commit_and_a_summary(demo: Demo) -> None:
    result = cli("verify", "main..feature", "--build", "python3 -m compileall -q shop tests",
                 "--json", "-j", "2", *LOCAL, cwd=demo.path)
    assert result.code == 3, result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    assert events[0]["event"] == "verify_start" and events[0]["jobs"] == 2
    verified = [e for e in events if e["event"] == "commit_verified"]
    assert sorted(e["number"] for e in verified) == list(range(1, 11))
    assert len({e["run"] for e in events}) == 1 and all("time" in e for e in events)
    wip = next(e for e in verified if e["subject"] == "wip")
    assert wip["passed"] is False and wip["build"].startswith("FAIL") and wip["tests"] is None
    assert "SyntaxError" in wip["tail"]
    assert all(e["tests"] is None for e in verified)  # no test command: only the build
    summary = events[-1]
    assert summary["event"] == "verify_summary" and summary["exit_code"] == 3
    assert (summary["commits"], summary["passed"], summary["failed"]) == (10, 9, 1)
    assert summary["failing"] == [wip["sha"]]


@pytest.mark.slow
def test_results_are_cached_in_git_notes_and_no_cache_runs_again(demo: Demo) -> None:
    args = ("verify", FIRST_FIVE, "--spec", str(demo.spec), *LOCAL, "--json")
    first = cli(*args, cwd=demo.path)
    notes = demo.git("notes", "--ref", "refs/notes/retcon-sandbox", "list").splitlines()
    assert len(notes) == 5  # one note per tree
    second = cli(*args, cwd=demo.path)
    again = cli(*args, "--no-cache", cwd=demo.path)
    for result, cached in ((first, False), (second, True), (again, False)):
        assert result.code == 3
        verified = [json.loads(line) for line in result.out.splitlines()
                    if '"commit_verified"' in line]
        assert len(verified) == 5 and all(e["cached"] is cached for e in verified)
    assert demo.git("status", "--porcelain") == "?? history-spec.toml"


@pytest.mark.slow
def test_configuration_errors_exit_1(demo: Demo) -> None:
    nothing = cli("verify", "main..feature", *LOCAL, cwd=demo.path)
    assert nothing.code == 1 and "no build or test command" in nothing.err
    unknown = cli("verify", "main..nope", "--test", "true", *LOCAL, cwd=demo.path)
    assert unknown.code == 1 and "unknown revision 'nope'" in unknown.err
    empty = cli("verify", "feature..main", "--test", "true", *LOCAL, cwd=demo.path)
    assert empty.code == 1 and "no commits to verify" in empty.err
    not_yet = cli("verify", str(demo.spec), *LOCAL)
    assert not_yet.code == 1 and "'feature-clean' does not exist yet" in not_yet.err
    missing = cli("verify", "main..feature", "--test", "no-such-tool --flag", *LOCAL,
                  cwd=demo.path)
    assert missing.code == 1 and "the test command cannot run in the sandbox" in missing.err
    usage = cli("verify", *LOCAL, cwd=demo.path)
    assert usage.code == 2 and "needs a spec or a revision range" in usage.err
    for result in (nothing, unknown, empty, not_yet, missing, usage):
        assert "Traceback" not in result.err


def test_one_commit_and_hostile_subjects(demo: Demo) -> None:
    from retcon_sandbox.repo.gitrepo import Repo

    Repo(demo.path).commit_files("feature", {"x.txt": "x\n"},
                                 "evil \x1b]0;owned\x07\x1b[2J subject")
    result = cli("verify", "feature", "--test", "cat x.txt", *LOCAL, cwd=demo.path)
    assert result.code == 0, result.out + result.err
    assert "\x1b" not in result.out and "\x07" not in result.out
    assert "evil \\e]0;owned\\x07\\e[2J subject" in result.out
    assert "1 commit: 1 passed" in result.out


def on_a_terminal(demo: Demo, env: dict[str, str] | None = None) -> str:
    """verify's output on a pseudo-terminal."""
    result = cli_on_a_terminal("verify", FIRST_FIVE, "--spec", str(demo.spec), "-j", "2",
                               *LOCAL, cwd=demo.path, env=env)
    assert result.code == 3
    return result.out


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"TERM": "dumb"}, {"NO_COLOR": "1"}])
def test_no_cursor_movement_for_a_dumb_terminal_or_no_color(demo: Demo,
                                                            env: dict[str, str]) -> None:
    text = on_a_terminal(demo, env)
    assert "\x1b" not in text and "FAIL" in text and "Failures:" in text


@pytest.mark.slow
def test_the_table_is_redrawn_in_place_on_a_terminal(demo: Demo) -> None:
    text = on_a_terminal(demo, {"TERM": "xterm", "NO_COLOR": ""})
    assert "\x1b[5F" in text  # back to the first of the 5 rows, to draw them again
    final = text.rsplit("\x1b[5F", 1)[1]
    assert final.count("\x1b[2K") == 5 and "FAIL" in final and "Failures:" in final


@pytest.mark.slow
def test_redoing_a_reconstruction_runs_no_build_and_no_test(demo: Demo) -> None:
    original = demo.spec.read_text()
    first = cli("execute", str(demo.spec), *LOCAL, "--non-interactive")
    assert first.code == 0 and first.out.count("Sandbox ready") == 4
    redo(demo, original)
    second = cli("execute", str(demo.spec), *LOCAL, "--non-interactive")
    assert second.code == 0, second.out + second.err
    assert second.out.count("Building... PASS (cached)") == 4
    assert second.out.count("Tests... PASS (cached)") == 4
    assert "Sandbox ready" not in second.out  # a cached `paths` commit starts no sandbox
    redo(demo, original)
    third = cli("execute", str(demo.spec), *LOCAL, "--non-interactive", "--no-cache")
    assert third.code == 0 and third.out.count("Sandbox ready") == 4
    assert "(cached)" not in third.out


@pytest.mark.slow
def test_the_fix_loop_reads_a_cached_failure_instead_of_running_it_again(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    with FakeOpenAI(reconstruction()) as model:
        assert cli("execute", str(demo.spec), *LOCAL, "--non-interactive",
                   env=llm_env(model.base_url)).code == 0
    redo(demo, original)
    with FakeOpenAI(reconstruction()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--non-interactive",
                     env=llm_env(model.base_url))
        prompts = [m["content"] for body in model.requests for m in body["messages"]
                   if m["role"] == "user"]
    assert result.code == 0, result.out + result.err
    assert "Building... FAIL (exit 1) (cached)" in result.out
    assert "def discounted_total(cart, code=None:" in result.out  # the cached tail is shown
    assert any("a cached result" in p and "SyntaxError" in p for p in prompts)
    assert "(cached)" in result.out and " s)" not in result.out.split("Commit 1/4")[1]
    assert git(demo.path, "rev-parse", "feature-clean^{tree}") == \
        git(demo.path, "rev-parse", "feature^{tree}")


# --- claims: notes this user's key does not authenticate ---------------------------------------

REF = "refs/notes/retcon-sandbox"


def forge_passes(demo: Demo, subjects: list[str]) -> None:
    """What anyone who can push the notes ref can do: claim a pass for failing commits, under
    the same cache key, sealed with a key of their own."""
    from retcon_sandbox.repo.gitrepo import Repo
    from retcon_sandbox.userkey import UserKey
    from retcon_sandbox.verify.cache import Cache, Key, Outcome, Stage

    repo = Repo(demo.path)
    forger = Cache(repo, key=UserKey(b"the forger's own key, not the user's", "forger"))
    for line in demo.git("log", "--format=%T %s", "main..feature").splitlines():
        tree, subject = line.split(" ", 1)
        if subject not in subjects:
            continue
        record = json.loads(demo.git("notes", "--ref", REF, "show", tree).splitlines()[-1])
        key = Key(record["build"], record["test"], record["environment"])
        stages = tuple(Stage(which, command, "PASS", True, False, 0.1)
                       for which, command in (("build", key.build), ("test", key.test))
                       if command)
        forger.put(tree, key, Outcome(stages, None, "", 600))


@pytest.mark.slow
def test_notes_others_wrote_are_claims_and_run_again(demo: Demo) -> None:
    args = ("verify", FIRST_FIVE, "--spec", str(demo.spec), *LOCAL)
    assert cli(*args, cwd=demo.path).code == 3
    forge_passes(demo, ["wip", "tests"])
    human = cli(*args, cwd=demo.path)
    assert human.code == 3, human.out + human.err  # the failing commits ran again, and failed
    table = rows(human.out)
    assert table["wip"][:2] == ["FAIL", "-"] and table["wip"][-1] != "yes"
    claims = human.out.split("Claimed by others (notes your key does not authenticate):")[1]
    assert "#3" in claims and "wip: claimed build PASS, tests PASS; not trusted, ran again: " \
        "FAIL" in claims
    assert "5 commits: 3 passed, 2 failed (3 cached)" in human.out

    forge_passes(demo, ["wip", "tests"])
    as_json = cli(*args, "--json", cwd=demo.path)
    assert as_json.code == 3
    verified = {e["subject"]: e for e in map(json.loads, as_json.out.splitlines())
                if e["event"] == "commit_verified"}
    assert verified["wip"]["claimed_by_others"] == {
        "passed": True, "build": "PASS", "tests": "PASS", "trusted": False}
    assert verified["wip"]["passed"] is False and verified["wip"]["cached"] is False
    assert verified["fix build"]["claimed_by_others"] is None

    forge_passes(demo, ["wip", "tests"])
    trusted = cli(*args, "--trust-notes", cwd=demo.path)  # the user chose to believe them
    assert trusted.code == 0, trusted.out + trusted.err
    assert rows(trusted.out)["wip"][-1] == "claim"
    assert "trusted (--trust-notes), not run" in trusted.out


@pytest.mark.slow
def test_another_users_results_are_claims_to_them(demo: Demo, tmp_path: Path) -> None:
    args = ("verify", FIRST_FIVE, "--spec", str(demo.spec), *LOCAL, "--json")
    assert cli(*args, cwd=demo.path).code == 3
    other = cli(*args, cwd=demo.path, env={"XDG_STATE_HOME": str(tmp_path / "other")})
    verified = [json.loads(line) for line in other.out.splitlines() if "commit_verified" in line]
    assert len(verified) == 5 and not any(e["cached"] for e in verified)  # all ran again
    shared = {"RETCON_SANDBOX_NOTES_KEY": "a shared secret from the CI's store, 40 chars"}
    assert cli(*args, cwd=demo.path, env=shared).code == 3
    again = cli(*args, cwd=demo.path, env=shared)
    assert all(json.loads(line)["cached"] for line in again.out.splitlines()
               if "commit_verified" in line)


def test_a_corrupted_notes_ref_is_an_error_that_says_how_to_clear_it(demo: Demo) -> None:
    demo.git("update-ref", REF, demo.git("rev-parse", "main:README.md"))
    blob = cli("verify", "main..feature", "--test", "true", *LOCAL, cwd=demo.path)
    demo.git("update-ref", REF, "main")
    commit = cli("execute", str(demo.spec), *LOCAL, "--non-interactive")
    for result in (blob, commit):
        assert result.code == 1 and "Traceback" not in result.err
        assert f"git update-ref -d {REF}" in result.err, result.err
    assert demo.git("branch", "--list", "feature-clean") == ""  # nothing was written


@pytest.mark.slow
def test_skip_is_honoured_by_verify(demo: Demo) -> None:
    args = ("verify", FIRST_FIVE, "--spec", str(demo.spec), *LOCAL, "--json")
    skipped = cli(*args, "--skip", "test", cwd=demo.path)
    verified = [json.loads(line) for line in skipped.out.splitlines()
                if "commit_verified" in line]
    assert skipped.code == 3 and len(verified) == 5
    assert all(e["tests"] is None for e in verified)  # not run, and not taken from a cache
    assert [e["subject"] for e in verified if not e["passed"]] == ["wip"]
    full = cli(*args, cwd=demo.path)  # a build-only result does not pass the tests
    assert full.code == 3
    failed = [json.loads(line) for line in full.out.splitlines() if "commit_verified" in line]
    assert sorted(e["subject"] for e in failed if not e["passed"]) == ["tests", "wip"]
    both = cli(*args, "--skip", "build", "--skip", "test", cwd=demo.path)
    assert both.code == 1 and "not skipped" in both.err


def test_engine_is_for_docker_and_execute_takes_one(demo: Demo) -> None:
    local = cli("verify", "main..feature", "--build", "true", *LOCAL, "--engine",
                "tcp://127.0.0.1:1", cwd=demo.path)
    assert local.code == 2, local.out + local.err
    assert "--engine names a Docker engine: it is not used with --sandbox local" in local.err
    two = cli("execute", str(demo.spec), *LOCAL, "--non-interactive", "--engine",
              "tcp://127.0.0.1:1", "--engine", "tcp://127.0.0.1:2")
    assert two.code == 2, two.out + two.err
    assert "--engine is given 2 times: this command runs one sandbox at a time" in two.err
