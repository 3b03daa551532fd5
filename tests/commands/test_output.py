"""Output that tells the truth: a commit with nothing left, timings, messages that match what
happens, the summary after squashing, `status`, JSON events, `-h` and `--version`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox import __version__
from retcon_sandbox.repo import demoproject as d
from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import Demo, Result, cli, cli_at_terminal, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Step, call
from tests.scripts import reconstruction, stuck_then_fixed, with_gaps, write

LOCAL = ("--sandbox", "local", "--non-interactive")
# Events about the whole run; every other event concerns one commit and carries its number.
RUN_EVENTS = {"spec", "override", "warning", "reaped", "branch_created", "branch_continued",
              "remainder", "assigning", "squashed", "tree_check", "summary", "error",
              "model_retry", "squash_verify", "verify_start", "verify_summary",
              # test_final: the finished tree, once per run
              "final_verify", "final_tree", "verify_phases",
              # a step's timing and heartbeat: a commit's number when it is one commit's
              # (the setup, the base check, the final tree and the squash check are not)
              "phase_start", "phase_end", "heartbeat",
              # verify's pool: a used sandbox serves several trees, or is replaced
              "sandbox_not_reused",
              # a prepared environment serves every commit (and tree) with the same inputs
              "setup", "setup_command", "setup_output", "setup_ready", "setup_disk",
              "setup_pruned", "setup_cache_pruned", "setup_cache_disk", "base_check",
              "git_metadata", "preflight",
              # plan: about the whole branch (plan_commit carries its number)
              "plan_start", "plan_model", "plan_written", "plan_check", "plan_shared",
              # the commands beside execute and verify: about images, containers, the demo
              "image", "image_built", "image_bootstrapped", "images_pruned", "clean", "demo",
              "environments_exported", "environments_imported",
              # report: about the page it wrote
              "report_written"}


def events(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.out.splitlines()]


def check_events(found: list[dict[str, Any]]) -> None:
    """Each event has a time and the run's id; each that concerns a commit, its number (a
    sandbox opened for the remainder step belongs to no single commit)."""
    assert found and len({e["run"] for e in found}) == 1
    in_remainder = False
    for event in found:
        assert isinstance(event["time"], float) and event["time"] > 1e9, event
        in_remainder = in_remainder or event["event"] == "remainder"
        if event["event"] in RUN_EVENTS or (in_remainder and event["event"] == "sandbox"):
            continue
        assert isinstance(event.get("number"), int), event


def subjects(demo: Demo) -> list[str]:
    return demo.git("log", "--reverse", "--format=%s", "main..feature-clean").splitlines()


def same_tree(demo: Demo) -> bool:
    return demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


# --- 6. a logical commit with nothing left ---------------------------------------------------

REASON = "Commit 1 already added shop/discounts.py whole.\nNothing of it is left."


def nothing_left_script() -> list[Step]:
    """Commit 1 takes commit 2's file too; commit 2's model first tries to leave a change behind
    (refused), undoes it, and says there is nothing to extract."""
    return [
        [write("shop/validation.py", d.VALIDATION), write("shop/cart.py", d.CART),
         write("tests/test_validation.py", d.TEST_VALIDATION),
         write("shop/discounts.py", d.DISCOUNTS),
         call("delete_file", path="shop/legacy_checks.py"), call("create_commit", message="m")],
        [call("read_diff", path="shop/discounts.py"), write("shop/stray.py", "x = 1\n"),
         call("nothing_to_extract", reason=REASON)],
        [call("delete_file", path="shop/stray.py"), call("nothing_to_extract", reason=REASON)],
        [write("tests/test_discounts.py", d.TEST_DISCOUNTS), call("create_commit", message="m")],
        [write("README.md", d.README), write("docs/discounts.md", d.DOCS),
         call("create_commit", message="m")],
    ]


@pytest.mark.slow
def test_the_model_says_nothing_is_left_and_the_run_goes_on(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(nothing_left_script()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        results = model.tool_results()
        offered = [t["function"]["name"] for t in model.requests[1]["tools"]]
    assert result.code == 0, result.out + result.err
    assert "nothing_to_extract" in offered
    assert any("the working state has changes: call create_commit" in r for r in results)
    assert "⚠ Nothing to extract: Commit 1 already added shop/discounts.py whole." in result.out
    assert "No commit made; the run goes on." in result.out
    assert subjects(demo) == [demo_project.COMMITS[i][0].splitlines()[0] for i in (0, 2, 3)]
    assert same_tree(demo)
    text = demo.spec.read_text()
    assert '{ nothing_to_extract = "Commit 1 already added shop/discounts.py whole.\\nNothing ' \
        'of it is left." }' in text
    summary = result.out.split("Complete!")[1]
    assert "3 logical commits created" in summary
    assert "Nothing to extract for #2 feat: discount codes: Commit 1 already added " \
        "shop/discounts.py whole.\n    Nothing of it is left." in summary
    status = cli("status", str(demo.spec))
    assert status.code == 0, status.out + status.err
    assert "∅ #2 nothing to extract feat: discount codes" in status.out
    assert "      nothing to extract: Commit 1 already added shop/discounts.py whole.\n" \
           "                          Nothing of it is left." in status.out
    assert "4/4 complete" in status.out
    rows = json.loads(cli("status", str(demo.spec), "--json").out)["commits"]
    assert rows[1]["state"] == "nothing to extract" and rows[1]["nothing"] == REASON


@pytest.mark.slow
def test_nothing_to_extract_is_refused_while_a_named_file_still_differs(tmp_path: Path) -> None:
    """Commit 3's hints name tests/test_discounts.py, which no later commit names: "nothing to
    extract" is refused while it differs, and the model must take it or give up."""
    demo = make_demo(tmp_path / "repo", with_paths=False)
    script = [
        *nothing_left_script()[:1],
        [call("nothing_to_extract", reason="commit 1 took it")],  # commit 2: nothing is owed
        [call("nothing_to_extract", reason="already there")],  # commit 3: refused
        [call("report_stuck", summary="cannot tell which part is mine")],
    ]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 3, result.out + result.err
    assert "Complete!" not in result.out
    assert any("named by this commit, still differ from the source branch: "
               "tests/test_discounts.py." in r for r in results), results
    assert "cannot tell which part is mine" in demo.spec.read_text()
    assert demo.spec.read_text().count("nothing_to_extract =") == 1


def shared_tests_spec() -> str:
    """Commit 4's hints name commit 3's file too (as #5's named #4's on the real range)."""
    text = demo_project.spec_text(False)
    hints = "README.md's Discount codes section and docs/discounts.md."
    assert hints in text
    return text.replace(hints, hints[:-1] + ", and tests/test_discounts.py's docstring.")


def first_two() -> list[Step]:
    return [[write("shop/validation.py", d.VALIDATION), write("shop/cart.py", d.CART),
             write("tests/test_validation.py", d.TEST_VALIDATION),
             call("delete_file", path="shop/legacy_checks.py"), call("create_commit", message="m")],
            [write("shop/discounts.py", d.DISCOUNTS), call("create_commit", message="m")]]


@pytest.mark.slow
def test_a_commit_never_vanishes_while_a_file_it_names_still_differs(tmp_path: Path) -> None:
    """Commit 3 names tests/test_discounts.py, and so does commit 4: "nothing to extract" is
    refused while it differs (a commit that is not later does not hold it); said again, the run
    stops (exit 3) and names the commit that has no commit, never `Complete!`. After a note,
    the model names commit 4, which names the file: commit 3 is recorded as having nothing,
    and commit 4 takes the file."""
    demo = make_demo(tmp_path / "repo", with_paths=False, spec_text=shared_tests_spec())
    script = [*first_two(),
              [call("nothing_to_extract", reason="commit 2 has it", held_by=2)],
              [call("nothing_to_extract", reason="commit 4 is about the tests too")]]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 3, result.out + result.err
    assert "Complete!" not in result.out + result.err
    assert any("tests/test_discounts.py. commit #2 is not a later commit (this is #3 of 4)."
               in r for r in results), results
    assert "commit #3 (test: cover discount codes) has no commit: the model said nothing is " \
        "left to extract, but tests/test_discounts.py, named by this commit, still differ " \
        "from the source branch; it named no later commit that holds them." in result.err
    assert "nothing_to_extract =" not in demo.spec.read_text()
    assert len(subjects(demo)) == 2

    text = demo.spec.read_text()
    stop = re.search(r'\{ stuck = "commit #3[^\n]*" \},\n', text)
    assert stop, text
    demo.spec.write_text(text[:stop.end()] + '    { resolved = "commit 4 holds it" },\n'
                         + text[stop.end():])
    script = [[call("nothing_to_extract", reason="commit 4 holds it", held_by=4)],
              [write("README.md", d.README), write("docs/discounts.md", d.DOCS),
               write("tests/test_discounts.py", d.TEST_DISCOUNTS),
               call("create_commit", message="m")]]
    with FakeOpenAI(script) as model:
        again = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert again.code == 0, again.out + again.err
    assert "Complete!" in again.out and same_tree(demo)
    assert "(What is left of its files is for commit #4, which names them.)" in \
        demo.spec.read_text().replace("\\n", "\n")
    assert len(subjects(demo)) == 3


def paths_overlap_spec() -> str:
    """Commit 1's paths include commit 2's only file."""
    return demo_project.spec_text(True).replace('"shop/legacy_checks.py"]',
                                                '"shop/legacy_checks.py", "shop/discounts.py"]')


@pytest.mark.slow
@pytest.mark.parametrize("squash", [False, True])
def test_a_paths_commit_with_nothing_left(tmp_path: Path, squash: bool) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=paths_overlap_spec())
    result = cli("execute", str(demo.spec), *LOCAL, "--json",
                 *(["--squash-wip"] if squash else []))
    assert result.code == 0, result.out + result.err
    found = events(result)
    check_events(found)
    nothing = next(e for e in found if e["event"] == "nothing_to_extract")
    assert nothing["number"] == 2 and "shop/discounts.py" in nothing["reason"]
    summary = found[-1]
    assert summary["event"] == "summary" and summary["logical"] == 3 and summary["commits"] == 3
    assert [n["number"] for n in summary["nothing"]] == [2]
    assert len(subjects(demo)) == 3 and same_tree(demo)
    assert "nothing_to_extract" in demo.spec.read_text()
    again = cli("execute", str(demo.spec), *LOCAL)  # done: nothing redone
    assert again.code == 0 and "Commit 2/4" not in again.out


# --- 7. output that tells the truth ---------------------------------------------------------

TIMED = re.compile(r"^  (Building|Tests)\.\.\. PASS \(\d+\.\d s\)$", re.MULTILINE)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_prints_only_the_outcome(demo: Demo, where: str) -> None:
    args = ("-q", "execute", str(demo.spec), *LOCAL) if where == "before" else \
        ("execute", str(demo.spec), *LOCAL, "--quiet")
    result = cli(*args)
    assert result.code == 0, result.out + result.err
    assert "Commit 1/4" not in result.out and "Building..." not in result.out
    assert "Tree check: cleaned == source ✓" in result.out and "Complete!" in result.out


@pytest.mark.slow
def test_verbose_prints_the_events_only_json_had(demo: Demo) -> None:
    quiet = cli("verify", str(demo.spec), "--sandbox", "local", "-v")  # no cleaned branch yet
    assert quiet.code == 1
    result = cli("-v", "verify", "main..feature", "--spec", str(demo.spec), "--sandbox",
                 "local", cwd=demo.path)
    assert result.code == 3, result.out + result.err
    assert "  [verify_start] range='main..feature' commits=10" in result.out
    plain = cli("verify", "main..feature", "--spec", str(demo.spec), "--sandbox", "local",
                cwd=demo.path)
    assert "[verify_start]" not in plain.out
    both = cli("execute", str(demo.spec), "-q", "-v")
    assert both.code == 2 and "not allowed with argument" in both.err


@pytest.mark.slow
def test_an_ascii_only_output_encoding_works(demo: Demo) -> None:
    """PYTHONIOENCODING=ascii: our symbols in ASCII, other characters escaped, no crash."""
    spec = demo.spec.read_text().replace("docs: document discount codes",
                                         "docs: documenté discount codes")
    demo.spec.write_text(spec)
    env = {"PYTHONIOENCODING": "ascii"}
    result = cli("execute", str(demo.spec), *LOCAL, env=env)
    assert result.code == 0, result.out + result.err
    assert "Tree check: cleaned == source ok" in result.out
    assert "document\\u00e9 discount codes" in result.out
    assert "x error" in cli("status", str(demo.path / "missing.toml"), env=env).err
    line = cli("status", str(demo.spec), "--json", env=env).out
    assert "document\\u00e9" in line and json.loads(line)["commits"][3]["subject"].endswith(
        "documenté discount codes")


@pytest.mark.slow
def test_build_and_test_lines_show_their_time(demo: Demo) -> None:
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert len(TIMED.findall(result.out)) == 8
    assert "Re-verifying" not in result.out and result.out.count("✓ Commit created") == 4


def test_a_failure_without_a_model_is_not_assessed(demo: Demo) -> None:
    result = cli("execute", str(demo.spec), *LOCAL, "--test", "echo 'tests: 1 failed'; exit 1")
    assert result.code == 3, result.out + result.err
    assert re.search(r"^  Tests\.\.\. FAIL \(exit 1, \d+\.\d s\)$", result.out, re.MULTILINE)
    assert "tests: 1 failed" in result.out
    assert "Assessing progress" not in result.out and "Fix attempt" not in result.out
    assert "no model is configured to fix them" in demo.spec.read_text()
    # a rerun would test the same tree: the hint says what can change it
    hint = "fix it yourself with a commit on feature-clean (its `paths` are not taken again"
    assert hint in result.err
    again = cli("execute", str(demo.spec), *LOCAL, "--test", "exit 1")
    assert again.code == 3 and "Previously stuck" in again.err and hint in again.err


@pytest.mark.slow
def test_a_resumed_commit_is_reverified_not_created(demo: Demo) -> None:
    assert cli("execute", str(demo.spec), *LOCAL).code == 0
    text = demo.spec.read_text()
    head, last = text.rsplit('    "complete",\n', 1)
    demo.spec.write_text(head + last)  # as if killed after the commit, before its tests
    tip = demo.git("rev-parse", "feature-clean")
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert f"Re-verifying {tip[:7]} (recorded before the run stopped)" in result.out
    assert "✓ Verified" in result.out and "✓ Commit created" not in result.out
    assert demo.spec.read_text() == text


@pytest.mark.slow
def test_a_cut_off_branch_update_is_recovered(demo: Demo) -> None:
    assert cli("execute", str(demo.spec), *LOCAL).code == 0
    text = demo.spec.read_text()
    head, last = text.rsplit('    "complete",\n', 1)
    demo.spec.write_text(head + last)
    tip = demo.git("rev-parse", "feature-clean")
    demo.git("update-ref", "refs/heads/feature-clean", "feature-clean~1")  # killed in between
    result = cli("execute", str(demo.spec), *LOCAL, "--json")
    assert result.code == 0, result.out + result.err
    found = events(result)
    check_events(found)
    kinds = [e["event"] for e in found]
    assert kinds.index("recovered") < kinds.index("reverifying") < kinds.index("commit_complete")
    assert next(e for e in found if e["event"] == "recovered")["number"] == 4
    assert next(e for e in found if e["event"] == "commit_complete")["created"] is False
    assert demo.git("rev-parse", "feature-clean") == tip


@pytest.mark.slow
def test_no_stuck_message_before_the_interactive_prompt(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    first, _ = stuck_then_fixed()
    with FakeOpenAI(first) as model:
        result = cli_at_terminal("execute", str(demo.spec), "--sandbox", "local",
                                 typed=b"SKIP\n", env=llm_env(model.base_url))
    assert result.code == 3, result.out + result.err
    before, after = result.out.split("Type a resolution note")
    assert "LLM: " in before and "Stuck - stopping" not in before
    assert "Stuck - stopping" in after  # the person chose to stop


@pytest.mark.slow
def test_the_summary_tells_what_to_do_and_after_squashing_describes_the_branch(
        tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction()) as model:
        first = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert first.code == 0, first.out + first.err
    summary = first.out.split("Complete!")[1]
    base = demo.git("rev-parse", "--short=7", "main")
    assert "4 logical commits created\n  1 fix commits\n" in summary
    assert f"Branch: feature-clean (5 commits on {base})" in summary
    assert "rerun with --squash-wip" in summary
    squashed = cli("execute", str(demo.spec), *LOCAL, "--squash-wip")  # all done: no model
    assert squashed.code == 0, squashed.out + squashed.err
    summary = squashed.out.split("Complete!")[1]
    assert "Squashed fix commits: 4 commits" in squashed.out
    assert "4 logical commits, 1 fix commit(s) squashed into them" in summary
    assert f"Branch: feature-clean (4 commits on {base})" in summary
    assert "fix commits\n" not in summary and "squash-wip" not in summary
    assert len(subjects(demo)) == 4 and same_tree(demo)
    for output in (first, squashed):
        assert "autosquash" not in output.out + output.err and "rebase" not in output.out


@pytest.mark.slow
def test_every_event_of_a_run_with_fixes_and_a_remainder(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    assign: list[Step] = [[call("assign_path", path="docs/discounts.md", commit=4)],
                          [call("finish_assignment")]]
    with FakeOpenAI(with_gaps(assign)) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    found = events(result)
    check_events(found)
    kinds = {e["event"] for e in found}
    assert {"build", "tests", "failure_output", "fix_attempt", "fix_done", "assessing",
            "sandbox", "remainder", "remainder_commit", "leftover_commit", "leftover",
            "creating_commit", "commit_complete"} <= kinds
    leftover = next(e for e in found if e["event"] == "leftover")
    assert leftover["number"] == 4 and leftover["paths"] == ["tests/test_validation.py"]


@pytest.mark.slow
def test_a_stuck_run_in_json(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    first, _ = stuck_then_fixed()
    with FakeOpenAI(first) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", env=llm_env(model.base_url))
    assert result.code == 3
    found = events(result)
    check_events(found)
    assert [e["event"] for e in found][-3:] == ["stuck", "stopping", "error"]
    assert found[-1]["kind"] == "stuck" and found[-1]["exit_code"] == 3


# --- status -------------------------------------------------------------------------------

STATUS_SPEC = '''source = "feature"
remote = "main"
cleaned = "feature-clean"

[[commit]]
message = "one"
history = ["started", { commit_created = "%s" }, "complete"]

[[commit]]
message = """two

with a body"""
history = ["started", { stuck = "line one\\nline two\\n  indented three" }]

[[commit]]
message = "three"
history = ["started", { nothing_to_extract = "first\\nsecond" }]

[[commit]]
message = "four"
''' % ("a" * 40)


def test_status_exits_3_when_stuck_and_indents_multi_line_text(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(STATUS_SPEC)
    result = cli("status", str(spec))
    assert result.code == 3, result.out + result.err
    assert result.out == (
        "spec.toml: feature → feature-clean (onto main)\n"
        "  ✓ #1 complete     one  1 commit(s)\n"
        "  ✗ #2 stuck        two\n"
        "      stuck: line one\n"
        "             line two\n"
        "               indented three\n"
        '      add { resolved = "what you changed" } after it, then rerun execute\n'
        "  ∅ #3 nothing to extract three\n"
        "      nothing to extract: first\n"
        "                          second\n"
        "  · #4 pending      four\n"
        "  2/4 complete\n")
    as_json = cli("status", str(spec), "--json")
    assert as_json.code == 3
    rows = json.loads(as_json.out)["commits"]
    assert [r["state"] for r in rows] == ["complete", "stuck", "nothing to extract", "pending"]
    spec.write_text(STATUS_SPEC.replace('{ stuck = "line one\\nline two\\n  indented three" }',
                                        '{ stuck = "x" }, { resolved = "fixed" }'))
    resolved = cli("status", str(spec))
    assert resolved.code == 0 and "↻ #2 resolved" in resolved.out


# --- the command line ---------------------------------------------------------------------

COMMANDS = [(), ("execute",), ("reconstruct",), ("report",), ("status",), ("prompt",), ("clean",),
            ("demo",), ("images",), ("images", "build"), ("images", "bootstrap"),
            ("images", "list"), ("images", "prune"), ("images", "tag"), ("completion",),
            ("version",)]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "top" for c in COMMANDS])
def test_help_and_version_work_on_every_command(command: tuple[str, ...]) -> None:
    helped = cli(*command, "-h")
    assert helped.code == 0 and helped.out.startswith(f"usage: retcon-sandbox {' '.join(command)}"
                                                      .rstrip() + " ")
    assert "--version" in helped.out
    version = cli(*command, "--version")
    assert version.code == 0 and version.out == f"retcon-sandbox {__version__}\n"


def test_every_event_about_a_commit_is_emitted_with_its_number() -> None:
    """The source, read: each `emit("kind", ...)` of a kind that is not about the whole run
    passes `number=` (or, for the sandbox, a mapping that holds it when there is one)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "runner"
    kinds: dict[str, list[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "emit" and node.args):
                continue
            first = node.args[0]  # a kind named by a variable (build, tests) must have it too
            kind = str(first.value) if isinstance(first, ast.Constant) else "(computed)"
            names = [k.arg or "**" for k in node.keywords]
            if path.name in ("context.py", "runlog.py") and names == ["**"] and \
                    kind == "(computed)":
                continue  # Buffered.replay, RunLog.emit: passed on, checked where emitted
            kinds.setdefault(kind, []).append(f"{path.name}:{node.lineno}")
            if kind not in RUN_EVENTS:
                assert "number" in names or (kind == "sandbox" and "**" in names), \
                    f"{path.name}:{node.lineno}: {kind} without number"
    assert {"(computed)", "failure_output", "sandbox", "recovered", "leftover",
            "nothing_to_extract", "resolved", "auto_response", "no_progress"} <= set(kinds)
