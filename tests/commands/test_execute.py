"""`retcon-sandbox execute` end to end: the real CLI, real repositories, a real HTTP model server.

These drive the loop through the local backend (what the Docker tier repeats in containers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import CLI, NEUTRAL, Demo, cli, cli_at_terminal, git, llm_env, make_demo
from tests.fake_openai import FakeOpenAI
from tests.scripts import reconstruction, stuck_then_fixed

LOCAL = ("--sandbox", "local", "--non-interactive")


def subjects(demo: Demo, branch: str = "feature-clean") -> list[str]:
    return demo.git("log", "--reverse", "--format=%s", f"main..{branch}").splitlines()


def assert_every_commit_passes(demo: Demo, tmp_path: Path, branch: str = "feature-clean") -> None:
    """Check out the state that completed each spec entry (a commit not followed by one of its
    fixups) into a scratch worktree, test side, and run the build and tests there."""
    log = demo.git("log", "--reverse", "--format=%H %s", f"main..{branch}").splitlines()
    for i, line in enumerate(log):
        sha = line[:40]
        if i + 1 < len(log) and log[i + 1][41:].startswith("fixup! "):
            continue
        tree = tmp_path / f"check-{sha[:7]}"
        demo.git("worktree", "add", "--detach", "-q", str(tree), sha)
        for command in (["-m", "compileall", "-q", "shop", "tests"],
                        ["-m", "pytest", "-q", "-p", "no:cacheprovider"]):
            proc = subprocess.run([sys.executable, *command], cwd=tree, capture_output=True,
                                  text=True)
            assert proc.returncode == 0, f"{sha[:7]}: {proc.stdout}{proc.stderr}"
        demo.git("worktree", "remove", "--force", str(tree))


def user_state(demo: Demo) -> tuple[str, str, str, str]:
    return (demo.git("symbolic-ref", "HEAD"), demo.git("rev-parse", "HEAD"),
            demo.git("status", "--porcelain", "--untracked-files=all"),
            demo.git("rev-parse", "feature"))


@pytest.mark.slow
def test_llm_reconstructs_a_messy_branch_into_four_commits(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    before = user_state(demo)
    with FakeOpenAI(reconstruction()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        assert result.code == 0, result.out + result.err
        assert model.remaining == 0
        results = model.tool_results()
    assert subjects(demo) == ["refactor: move input validation into shop/validation.py",
                              "feat: discount codes", "fixup! feat: discount codes",
                              "test: cover discount codes", "docs: document discount codes"]
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")
    # the message is the spec's, verbatim, body included
    assert demo.git("log", "-1", "--format=%B", "feature-clean~4") == demo_project.COMMITS[0][0]
    assert_every_commit_passes(demo, tmp_path)
    # malformed calls were answered with errors the model can act on
    assert any("unknown tool 'rm_rf'" in r for r in results)
    assert any("not valid JSON" in r for r in results)
    assert any("read_file needs the argument 'path'" in r for r in results)
    assert any(r.startswith("Build PASS") for r in results)
    assert any(r.startswith("Tests PASS") and "passed" in r for r in results)
    assert any(r.startswith("Wrote shop/discounts.py") for r in results)
    # the refactor's deletion is in the refactor's commit
    assert "shop/legacy_checks.py" not in demo.git("ls-tree", "-r", "--name-only",
                                                   "feature-clean~4")
    # progress reads like the seed's session
    for line in ("Commit 2/4: feat: discount codes", "Building... FAIL", "Fix attempt 1:",
                 "Creating fixup commit...", "Tree check: cleaned == source ✓", "Complete!",
                 "1 fix commits", "rerun with --squash-wip", "Tokens: #1 "):
        assert line in result.out, line
    # the spec: everything the user wrote is still there, and each commit ends in complete
    spec_text = demo.spec.read_text()
    assert spec_text.startswith(original.split("[[commit]]")[0])
    assert spec_text.count('"complete"') == 4
    transcripts = list((demo.path / ".git" / "retcon-sandbox").glob("*.transcript.jsonl"))
    assert len(transcripts) == 1 and f"Transcript: {transcripts[0]}" in result.out
    transcript = transcripts[0].read_text().splitlines()
    assert len(transcript) == 10 and json.loads(transcript[0])["usage"]["prompt_tokens"] == 100
    after = user_state(demo)
    assert after[:2] == before[:2] and after[3] == before[3]  # HEAD and source untouched
    assert after[2] == before[2]  # and the work tree: the run's own files are under .git


@pytest.mark.slow
def test_paths_only_spec_needs_no_model(demo: Demo, tmp_path: Path) -> None:
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert subjects(demo) == [c[0].splitlines()[0] for c in demo_project.COMMITS]
    assert_every_commit_passes(demo, tmp_path)
    again = cli("execute", str(demo.spec), *LOCAL)  # all complete: nothing to do, still green
    assert again.code == 0 and "Commit 1/4" not in again.out


def test_the_base_commit_explains_a_first_commit_that_fails(demo: Demo, tmp_path: Path
                                                             ) -> None:
    """The base is built and tested only when the first commit fails: a missing module there
    stops the run with its name (exit 1) before a fix is asked for, and a rerun verifies the
    first commit again; --no-base-check skips the check; another failure is a warning and the
    run goes on. A first commit that passes runs no base check at all."""
    test = f"{sys.executable} -c 'import retcon_no_such_module'"
    missing = cli("execute", str(demo.spec), *LOCAL, "--test", test)
    assert missing.code == 1, missing.out + missing.err
    assert "the module 'retcon_no_such_module' is not installed" in missing.err
    assert "[sandbox] setup" in missing.err and "--no-base-check" in missing.err
    assert missing.out.index("Tests... FAIL") < missing.out.index("Checking the base commit")
    assert subjects(demo) == [demo_project.COMMITS[0][0].splitlines()[0]]
    again = cli("execute", str(demo.spec), *LOCAL, "--test", test)  # cached: the same stop
    assert again.code == 1 and "is not installed" in again.err, again.out + again.err
    assert "Checking the base commit: build PASS, tests FAIL (exit 1) (cached)" in again.out
    skipped = cli("execute", str(demo.spec), *LOCAL, "--test", test, "--no-base-check")
    assert skipped.code == 3 and "Checking the base commit" not in skipped.out  # stuck at commit 1
    other = make_demo(tmp_path / "other", with_paths=True)
    failing = cli("execute", str(other.spec), *LOCAL, "--test", "echo 3 failed; exit 1")
    assert failing.code == 3, failing.out + failing.err  # goes on, and the first commit fails
    assert "⚠ the base commit's tests already fail (3 failed)" in failing.out
    assert "Checking the base commit: build PASS, tests FAIL (exit 1)" in failing.out
    passing = make_demo(tmp_path / "passing", with_paths=True)
    done = cli("execute", str(passing.spec), *LOCAL, "--test", "true")  # passes, cheaply
    assert done.code == 0 and "Checking the base commit" not in done.out, done.out + done.err


def test_no_model_and_commits_without_paths_stop_before_doing_anything(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1
    assert "#1 refactor: move input validation" in result.err and "--model" in result.err
    assert demo.spec.read_text() == original
    assert "feature-clean" not in demo.git("branch", "--list")


@pytest.mark.slow
def test_stuck_then_resolved_then_resume(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    first, second = stuck_then_fixed()
    with FakeOpenAI(first) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 3, result.out + result.err
    assert "Stuck - stopping" in result.out and "reorder or merge" in result.out
    assert '{ resolved = "description of what you changed" }' in result.err

    again = cli("execute", str(demo.spec), *LOCAL, env=llm_env("http://127.0.0.1:9/v1"))
    assert again.code == 3 and "Resuming from commit 2/4" in again.out
    assert "Previously stuck - add a `resolved` entry to continue" in again.err
    assert "add after the `stuck` entry" in again.err

    text = demo.spec.read_text()
    demo.spec.write_text(text.replace(
        "    { stuck = ", "    { stuck = ").replace(
        ' or merge the commits" },\n]',
        ' or merge the commits" },\n    { resolved = "Discounts only need check_price." },\n]'))
    with FakeOpenAI(second) as model:
        final = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        prompts = [m["content"] for body in model.requests for m in body["messages"]
                   if m["role"] == "user"]
    assert final.code == 0, final.out + final.err
    assert "Resolved: Discounts only need check_price." in final.out
    assert any("Discounts only need check_price." in p and "reorder or merge" in p
               for p in prompts)
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


@pytest.mark.slow
def test_a_prewritten_response_resolves_stuck_without_stopping(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    text = demo.spec.read_text().replace(
        'hints = "Only shop/discounts.py',
        'history = [{ response = "Use check_price from commit 1." }]\n'
        'hints = "Only shop/discounts.py')
    demo.spec.write_text(text)
    first, second = stuck_then_fixed()
    with FakeOpenAI(first + second) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert "Using the pre-written response: Use check_price from commit 1." in result.out


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_completes_consistently(demo: Demo, tmp_path: Path) -> None:
    slow = demo.spec.read_text().replace(
        'test = "python3 -m pytest -q -p no:cacheprovider"',
        'test = "sleep 0.5; python3 -m pytest -q -p no:cacheprovider"')
    demo.spec.write_text(slow)
    proc = subprocess.Popen([*CLI, "execute", str(demo.spec), *LOCAL], cwd=NEUTRAL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while demo.spec.read_text().count("commit_created") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert demo.spec.read_text().count('"complete"') < 4

    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert "Resuming from commit" in result.out
    assert subjects(demo) == [c[0].splitlines()[0] for c in demo_project.COMMITS]
    recorded = [line.split('"')[1] for line in demo.spec.read_text().splitlines()
                if "commit_created" in line]
    assert recorded == demo.git("rev-list", "--reverse", "main..feature-clean").splitlines()
    assert_every_commit_passes(demo, tmp_path)


@pytest.mark.slow
def test_a_run_killed_inside_its_branch_update_is_finished_on_rerun(demo: Demo) -> None:
    """kill -9 between git's ref lock and its rename: the spec recorded the commit, the branch
    did not move, and git's lock file holds the new value. The rerun removes that lock (and
    only such a lock) and finishes the update."""
    assert cli("execute", str(demo.spec), *LOCAL).code == 0
    last = demo.git("rev-parse", "feature-clean")
    text = demo.spec.read_text()
    cut = text.rindex('    "complete",\n')
    demo.spec.write_text(text[:cut] + text[cut + len('    "complete",\n'):])
    demo.git("update-ref", "refs/heads/feature-clean", f"{last}~1")
    lock = demo.path / ".git" / "refs" / "heads" / "feature-clean.lock"
    lock.write_text("1" * 40 + "\n")  # another process's update: left alone, and named
    refused = cli("execute", str(demo.spec), *LOCAL)
    assert refused.code == 1, refused.out + refused.err
    assert f"rm {lock}" in refused.out + refused.err and lock.exists()
    lock.write_text(last + "\n")  # the killed run's own update
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert "removed the lock a killed update of feature-clean left" in result.out
    assert not lock.exists() and demo.git("rev-parse", "feature-clean") == last
    assert demo.spec.read_text().count('"complete"') == 4


@pytest.mark.slow
def test_a_run_killed_while_creating_the_branch_is_finished_on_rerun(demo: Demo) -> None:
    lock = demo.path / ".git" / "refs" / "heads" / "feature-clean.lock"
    lock.write_text(demo.git("merge-base", "main", "feature") + "\n")
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert "removed the lock a killed creation of feature-clean left" in result.out + result.err
    assert not lock.exists()


@pytest.mark.slow
def test_squash_wip_leaves_one_commit_per_entry(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip",
                     env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert subjects(demo) == [c[0].splitlines()[0] for c in demo_project.COMMITS]
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")
    assert_every_commit_passes(demo, tmp_path)


@pytest.mark.slow
def test_a_model_outage_mid_run_is_an_error_not_a_stuck_commit(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI([]) as model:  # every call but the preflight answers 500
        result = cli("execute", str(demo.spec), *LOCAL,
                     env={**llm_env(model.base_url), "RETCON_SANDBOX_MODEL_ATTEMPTS": "3"})
        calls = len(model.requests)
    assert result.code == 1, result.out + result.err
    assert calls == 3
    assert "retry 2/3" in result.err and "retry 3/3" in result.err
    assert "the model endpoint failed after 3 attempts: HTTP 500" in result.err
    assert "fake-model" in result.err and model.base_url in result.err
    assert "stuck" not in demo.spec.read_text()


@pytest.mark.slow
def test_leftover_changes_go_into_a_loud_final_commit(tmp_path: Path) -> None:
    text = demo_project.spec_text(True).replace('paths = ["README.md", "docs"]',
                                                'paths = ["docs"]')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert "WARNING: the spec's commits did not cover everything" in result.out
    assert "README.md" in result.out
    assert subjects(demo)[-1] == "Remaining changes from feature"
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


@pytest.mark.slow
def test_json_events_and_status(demo: Demo) -> None:
    result = cli("execute", str(demo.spec), *LOCAL, "--json")
    assert result.code == 0, result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "spec" and kinds[-1] == "summary" and kinds.count("commit_complete") == 4
    check = next(e for e in events if e["event"] == "tree_check")
    assert check["equal"] is True and check["differing"] == 0
    assert all({"time", "run"} <= set(e) for e in events)
    assert len({e["run"] for e in events}) == 1
    assert [e["number"] for e in events if e["event"] == "commit_complete"] == [1, 2, 3, 4]
    status = cli("status", str(demo.spec))
    assert status.code == 0 and "4/4 complete" in status.out


def test_bad_input_gets_a_clear_error_and_nothing_is_lost(demo: Demo) -> None:
    broken = demo.spec.read_text().replace('paths = ["shop/discounts.py"]', 'paths = [1]')
    demo.spec.write_text(broken)
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1
    assert "history-spec.toml: [[commit]] #2 → paths[0]: expected a path or pattern" in result.err
    assert "Traceback" not in result.err and demo.spec.read_text() == broken
    missing = cli("execute", str(demo.spec.with_name("nope.toml")), *LOCAL)
    assert missing.code == 1 and "no such file" in missing.err
    usage = cli("execute", str(demo.spec), "--skip", "everything")
    assert usage.code == 2


def test_unknown_branch_and_checked_out_cleaned_branch_are_refused(demo: Demo) -> None:
    demo.spec.write_text(demo.spec.read_text().replace('source = "feature"', 'source = "nope"'))
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1 and "unknown revision 'nope'" in result.err

    demo.spec.write_text(demo.spec.read_text().replace('source = "nope"', 'source = "feature"'))
    git(demo.path, "checkout", "-q", "-b", "feature-clean")
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1 and "is checked out" in result.err


@pytest.mark.slow
def test_fixes_that_change_nothing_exhaust_the_budget(tmp_path: Path) -> None:
    from tests.fake_openai import call
    from tests.scripts import BROKEN_DISCOUNTS, write

    demo = make_demo(tmp_path / "repo", with_paths=False)
    first, _ = stuck_then_fixed()
    script = [first[0],
              [write("shop/discounts.py", BROKEN_DISCOUNTS), call("create_commit", message="m")],
              [call("create_commit", message="try")], [call("create_commit", message="again")],
              [call("create_commit", message="once more")]]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 3, result.out + result.err
    assert sum("nothing to commit" in r for r in results) == 2
    assert "No progress: 3 attempts to commit changed nothing" in demo.spec.read_text()


@pytest.mark.slow
def test_stuck_at_a_terminal_asks_for_a_note_and_goes_on(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    first, second = stuck_then_fixed()
    with FakeOpenAI(first + second) as model:
        result = cli_at_terminal("execute", str(demo.spec), "--sandbox", "local",
                                 typed=b"Discounts only need check_price from commit 1.\n",
                                 env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert "Type a resolution note" in result.out
    assert '{ resolved = "Discounts only need check_price from commit 1." }' in \
        demo.spec.read_text()


@pytest.mark.slow
def test_demo_with_a_model_uses_hints(tmp_path: Path) -> None:
    with FakeOpenAI(reconstruction()) as model:
        result = cli("demo", "--llm", "--sandbox", "local", "--directory",
                     str(tmp_path / "demo"), env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    spec_text = (tmp_path / "demo" / "history-spec.toml").read_text()
    assert "\npaths = " not in spec_text and "hints only: a model extracts" in spec_text
    assert "Tree check: feature-clean == feature ✓" in result.out
    # the one line the model invented: its first, broken attempt at commit 2 (fixed after)
    flagged = [line for line in result.out.splitlines() if "neither" in line]
    assert flagged == ["  Content in neither base nor source, #2 feat: discount codes: "
                       "shop/discounts.py (+2 lines)"], result.out
    assert "first invented line, shop/discounts.py: def discounted_total(cart, code=None:" \
        in result.out
    no_model = cli("demo", "--llm", "--sandbox", "local", "--directory", str(tmp_path / "d2"))
    assert no_model.code == 1 and "need a model" in no_model.err


@pytest.mark.slow
def test_remaining_changes_become_fixups_of_their_commits_or_a_loud_final_commit(
        tmp_path: Path) -> None:
    from tests.fake_openai import call
    from tests.scripts import with_gaps

    demo = make_demo(tmp_path / "repo", with_paths=False)
    assign = [[call("assign_path", path="docs/discounts.md", commit=4),
               call("assign_path", path="nope.py", commit=1)],
              [call("finish_assignment")]]
    with FakeOpenAI(with_gaps(assign)) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 0, result.out + result.err
    assert "nope.py is not among the remaining paths" in " ".join(results)
    assert subjects(demo)[-2:] == ["fixup! docs: document discount codes",
                                   "Remaining changes from feature"]
    assert "WARNING: the spec's commits did not cover everything" in result.out
    assert "tests/test_validation.py" in result.out.split("WARNING")[1]
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")
    history = demo.spec.read_text().split("docs: document discount codes")[1]
    assert history.count('"complete"') == 3 and history.count("commit_created") == 3


@pytest.mark.slow
def test_squash_folds_remaining_changes_into_the_commits_they_belong_to(tmp_path: Path) -> None:
    from tests.fake_openai import call
    from tests.scripts import with_gaps

    demo = make_demo(tmp_path / "repo", with_paths=False)
    assign = [[call("assign_path", path="docs/discounts.md", commit=4),
               call("assign_path", path="tests/test_validation.py", commit=1)],
              [call("finish_assignment")]]
    with FakeOpenAI(with_gaps(assign)) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip",
                     env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert subjects(demo) == [c[0].splitlines()[0] for c in demo_project.COMMITS]
    first = demo.git("ls-tree", "-r", "--name-only", "feature-clean~3").splitlines()
    assert "tests/test_validation.py" in first and "shop/discounts.py" not in first
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")
    assert_every_commit_passes(demo, tmp_path)


@pytest.mark.slow
def test_demo_run_from_inside_another_repository(tmp_path: Path) -> None:
    """README command 1 runs in the checkout: the demo works on its own repository, not on the
    one containing the current directory."""
    outer = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    result = cli("demo", "--sandbox", "local", "--directory", str(tmp_path / "demo"), cwd=outer)
    assert result.code == 0, result.out + result.err
    assert "Tree check: feature-clean == feature ✓" in result.out
