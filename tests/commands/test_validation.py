"""Validate before writing: every bad spec, branch, repository or option stops the run with a
message and an exit code before the cleaned branch is created or any entry appended (the spec
stays byte for byte what it was)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Demo, Result, cli, git, make_demo

LOCAL = ("--sandbox", "local", "--non-interactive")


def refused(demo: Demo, *args: str, code: int = 1, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Result:
    """Run execute; it must fail with `code`, without a traceback, having written nothing."""
    before = demo.spec.read_bytes()
    branches = git(demo.path, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads")
    result = cli("execute", str(demo.spec), *LOCAL, *args, env=env, cwd=cwd)
    assert result.code == code, result.out + result.err
    assert "Traceback" not in result.err + result.out
    assert demo.spec.read_bytes() == before
    assert git(demo.path, "for-each-ref", "--format=%(refname) %(objectname)",
               "refs/heads") == branches
    return result


def edited(demo: Demo, old: str, new: str) -> Demo:
    text = demo.spec.read_text()
    assert old in text, old
    demo.spec.write_text(text.replace(old, new, 1))
    return demo


# --- keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new", "message"), [
    ('paths = ["shop/discounts.py"]', 'pahts = ["shop/discounts.py"]',
     "[[commit]] #2 → pahts: unknown key; did you mean `paths`?"),
    ('hints = "tests/test_discounts.py in its final form."',
     'hint = "tests/test_discounts.py in its final form."',
     "[[commit]] #3 → hint: unknown key; did you mean `hints`?"),
    ('cleaned = "feature-clean"', 'cleaned = "feature-clean"\nclaened = "x"',
     "claened: unknown key; did you mean `cleaned`?"),
    ("[sandbox]", "[sanbox]", "sanbox: unknown key; did you mean `sandbox`?"),
    ('build = "python3', 'biuld = "python3', "[sandbox] → biuld: unknown key; did you mean "
     "`build`?"),
    ('paths = ["shop/discounts.py"]',
     'paths = ["shop/discounts.py"]\nhistory = [{ resovled = "x" }]',
     "[[commit]] #2 → history[0]: unknown entry `resovled`; did you mean `resolved`?"),
])
def test_unknown_keys_anywhere_are_refused_with_a_suggestion(demo: Demo, old: str, new: str,
                                                             message: str) -> None:
    result = refused(edited(demo, old, new))
    assert f"history-spec.toml: {message}" in result.err


# --- branches -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bad..name", "-dash", "ends.lock", "with space", "a:b", "x/"])
def test_a_cleaned_name_git_would_refuse_is_refused(demo: Demo, name: str) -> None:
    result = refused(edited(demo, 'cleaned = "feature-clean"', f'cleaned = "{name}"'))
    assert "is not a valid branch name" in result.err and "check-ref-format" in result.err


@pytest.mark.parametrize(("old", "new", "same_as"), [
    ('cleaned = "feature-clean"', 'cleaned = "main"', "remote"),
    ('cleaned = "feature-clean"', 'cleaned = "feature"', "source"),
    ('remote = "main"', 'remote = "refs/heads/main"\ncleaned = "main"', "remote"),
    ('source = "feature"', 'source = "heads/feature"\ncleaned = "feature"', "source"),
])
def test_cleaned_may_not_be_source_or_remote_however_spelled(demo: Demo, old: str, new: str,
                                                             same_as: str) -> None:
    if "cleaned" in new and "cleaned" not in old:
        edited(demo, 'cleaned = "feature-clean"', "")
    result = refused(edited(demo, old, new))
    assert f"`{same_as}`" in result.err and "cleaned" in result.err


def test_cleaned_given_as_a_ref_is_refused(demo: Demo) -> None:
    result = refused(edited(demo, 'cleaned = "feature-clean"',
                            'cleaned = "refs/heads/feature-clean"'))
    assert "give the branch's name" in result.err and "'feature-clean'" in result.err


def test_a_cleaned_branch_checked_out_in_a_linked_worktree_is_refused(demo: Demo,
                                                                      tmp_path: Path) -> None:
    demo.git("branch", "feature-clean", "main")
    demo.git("worktree", "add", "-q", str(tmp_path / "linked"), "feature-clean")
    result = refused(demo)
    assert "is checked out in" in result.err and str(tmp_path / "linked") in result.err


def test_source_equal_to_remote_is_nothing_to_reconstruct(demo: Demo) -> None:
    demo.git("branch", "same", "main")
    result = refused(edited(demo, 'source = "feature"', 'source = "same"'))
    assert "nothing to reconstruct" in result.err


def test_a_source_that_changes_nothing_is_nothing_to_reconstruct(demo: Demo) -> None:
    tree = demo.git("rev-parse", "main^{tree}")
    empty = demo.git("commit-tree", tree, "-p", "main", "-m", "changes nothing")
    demo.git("branch", "empty", empty)
    result = refused(edited(demo, 'source = "feature"', 'source = "empty"'))
    assert "nothing to reconstruct" in result.err and "changes nothing" in result.err


def test_a_shallow_clone_suggests_unshallow(demo: Demo, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--no-single-branch",
                    f"file://{demo.path}", str(clone)], check=True)
    spec = clone.parent / "clone-spec.toml"
    spec.write_text(demo.spec.read_text().replace('source = "feature"', 'source = "origin/feature"'
                                                  ).replace('remote = "main"',
                                                            'remote = "origin/main"'))
    shallow = Demo(clone, spec)
    result = refused(shallow, "--repo", str(clone))
    assert "shallow clone" in result.err and "git fetch --unshallow" in result.err


# --- spec content ---------------------------------------------------------------------------


def test_empty_paths_are_refused(demo: Demo) -> None:
    result = refused(edited(demo, 'paths = ["shop/discounts.py"]', "paths = []"))
    assert "[[commit]] #2 → paths: is empty" in result.err


@pytest.mark.parametrize(("history", "message"), [
    ('["started", { resolved = "did it" }]',
     "[[commit]] #1 → history[1]: `resolved` with no `stuck` before it to resolve"),
    ('["started", "complete"]', "[[commit]] #1 → history[1]: `complete` before any "
     "`commit_created`"),
])
def test_impossible_history_sequences_are_refused(demo: Demo, history: str,
                                                  message: str) -> None:
    result = refused(edited(demo, '"shop/legacy_checks.py"]',
                            f'"shop/legacy_checks.py"]\nhistory = {history}'))
    assert f"history-spec.toml: {message}" in result.err


def test_a_recorded_commit_that_does_not_exist_is_refused(demo: Demo) -> None:
    missing = "0123456789abcdef0123456789abcdef01234567"
    result = refused(edited(demo, '"shop/legacy_checks.py"]',
                            f'"shop/legacy_checks.py"]\nhistory = ["started", '
                            f'{{ commit_created = "{missing}" }}]'))
    assert "commit_created 0123456789ab does not exist in this repository" in result.err


@pytest.mark.parametrize(("setting", "message"), [
    ("timeout = 0", "[sandbox] → timeout: must be from 1 to 86400"),
    ("timeout = -5", "[sandbox] → timeout: must be from 1 to 86400"),
    ("timeout = nan", "[sandbox] → timeout: expected a number"),
    ("cpus = 0", "[sandbox] → cpus: must be from 0.1 to 1024"),
    ("pids = 0", "[sandbox] → pids: must be from 32 to"),
    ('memory = "0m"', "[sandbox] → memory: must be from 64m to"),
    ('workspace_size = "-1g"', "[sandbox] → workspace_size: expected a size with a unit"),
])
def test_numeric_settings_must_be_greater_than_zero(demo: Demo, setting: str,
                                                    message: str) -> None:
    result = refused(edited(demo, "[sandbox]\n", f"[sandbox]\n{setting}\n"))
    assert f"history-spec.toml: {message}" in result.err


@pytest.mark.parametrize(("option", "value"), [
    ("--timeout", "0"), ("--timeout", "-1"), ("--timeout", "nan"), ("--timeout", "inf"),
    ("--timeout", "soon"), ("--model-timeout", "0"), ("--model-timeout", "nan"),
    ("--model-timeout", "1e300"), ("--model-timeout", "9" * 400), ("--seed", "9" * 400),
])
def test_numeric_options_must_be_greater_than_zero(demo: Demo, option: str, value: str) -> None:
    result = refused(demo, option, value, code=2)
    assert f"argument {option}: expected a" in result.err and "-h" in result.err


@pytest.mark.parametrize(("name", "value"), [
    ("RETCON_SANDBOX_MODEL_TIMEOUT", "0"), ("RETCON_SANDBOX_MODEL_TIMEOUT", "nan"),
    ("RETCON_SANDBOX_MODEL_ATTEMPTS", "0"), ("RETCON_SANDBOX_MODEL_ATTEMPTS", "2.5"),
    ("RETCON_SANDBOX_MODEL_MAX_WAIT", "-1"),
])
def test_numeric_environment_settings_must_be_greater_than_zero(demo: Demo, name: str,
                                                                value: str) -> None:
    env = {"RETCON_SANDBOX_MODEL": "m", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", name: value}
    result = refused(demo, env=env)
    assert f"{name}={value!r} is not a" in result.err and "greater than 0" in result.err


@pytest.mark.parametrize(("name", "value", "allowed"), [
    ("RETCON_SANDBOX_MODEL_ATTEMPTS", "9" * 400, "a whole number greater than 0 and at most 1000"),
    ("RETCON_SANDBOX_MODEL_TIMEOUT", "1e300", "a number greater than 0 and at most 86400"),
    ("RETCON_SANDBOX_MODEL_DEADLINE", "9" * 400, "a number greater than 0 and at most 86400"),
])
def test_environment_settings_too_large_for_a_timer_are_refused(demo: Demo, name: str,
                                                                value: str, allowed: str) -> None:
    env = {"RETCON_SANDBOX_MODEL": "m", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", name: value}
    result = refused(demo, env=env)
    assert f"{name}={value[:40]!r}" in result.err and f"is not {allowed}" in result.err
    assert "internal error" not in result.err


UNREADABLE_TOML = {  # what tomllib refuses with other exceptions than TOMLDecodeError
    "an integer of 5000 digits": ("x = " + "9" * 5000, "Exceeds the limit (4300 digits)"),
    "arrays nested 5000 deep": ("x = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_TOML))
def test_toml_that_tomllib_refuses_in_any_way_is_a_spec_error(demo: Demo, case: str) -> None:
    line, reason = UNREADABLE_TOML[case]
    demo.spec.write_text(f"{line}\n{demo.spec.read_text()}")
    spec = str(demo.spec)
    for command in (("status", spec), ("status", "--json", spec), ("plan", "--check", spec),
                    ("verify", spec, "--sandbox", "local")):
        result = cli(*command, cwd=demo.path)
        assert result.code == 1, (command, result.out + result.err)
        said = result.out + result.err
        assert "history-spec.toml: not valid TOML" in said and reason in said, command
        assert "internal error" not in said and "set_int_max_str_digits" not in said
    result = refused(demo)
    assert "history-spec.toml: not valid TOML" in result.err and reason in result.err


@pytest.mark.parametrize("url", ["localhost:11434/v1", "htp://localhost/v1", "http:///v1",
                                 "http://host:99999/v1", "http://host:port/v1", " http://h/v1",
                                 "http://h/v1?x=1", "", "http://a..b/v1",
                                 "http://" + "a" * 300 + ".com/v1", "http://[::1]x/v1",
                                 "http://[::1/v1", "http://h/" + "p" * 70_000,
                                 "http://h\udcff/v1"])
def test_a_malformed_base_url_is_refused_at_once(demo: Demo, url: str) -> None:
    if url:
        result = refused(demo, "--base-url", url, "--model", "m", code=2)
        assert "argument --base-url:" in result.err and "is not an endpoint's base URL" \
            in result.err
    env = {"RETCON_SANDBOX_MODEL": "m", "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": url or "ftp://h"}
    result = refused(demo, env=env, code=2)
    assert "OPENAI_BASE_URL=" in result.err and "is not an endpoint's base URL" in result.err
    assert "unset it" in result.err


# --- commands -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["build", "test"])
def test_a_command_that_is_not_found_is_a_configuration_error(demo: Demo, which: str) -> None:
    first = () if which == "build" else ("--skip", "build")  # a build may make the tests' program
    result = refused(demo, f"--{which}", "no-such-tool-xyz --flag", *first)
    assert f"the {which} command cannot run in the sandbox (no-such-tool-xyz: not found, or " \
        "not an executable file): no-such-tool-xyz --flag" in result.err
    assert f"Check --{which}" in result.err and "Traceback" not in result.err
    assert "stuck" not in demo.spec.read_text()  # not the code's fault: nothing for the model
    again = cli("execute", str(demo.spec), *LOCAL)  # fixed: the run goes on from the spec
    assert again.code == 0, again.out + again.err
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


@pytest.mark.slow
def test_a_tests_program_the_build_makes_is_not_refused(demo: Demo) -> None:
    build = "mkdir -p bin && printf '#!/bin/sh\\nexit 0\\n' > bin/made && chmod +x bin/made"
    result = cli("execute", str(demo.spec), *LOCAL, "--build", build, "--test", "bin/made")
    assert result.code == 0, result.out + result.err


@pytest.mark.slow
def test_a_command_that_is_not_executable_is_a_configuration_error(demo: Demo) -> None:
    result = refused(demo, "--build", "./README.md")
    assert "the build command cannot run in the sandbox (./README.md: not found, or not an " \
        "executable file): ./README.md\n" in result.err
    assert "stuck" not in demo.spec.read_text()
    later = cli("execute", str(demo.spec), *LOCAL, "--build", "true && ./README.md")
    assert later.code == 1, later.out + later.err  # found only when it runs (exit 126)
    assert "the build command cannot run in the sandbox (exit 126): true && ./README.md\n" \
        in later.err and "Permission denied" in later.err


def test_nothing_is_created_for_a_fresh_spec_with_an_error_in_a_later_commit(
        tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    result = refused(edited(demo, 'paths = ["README.md", "docs"]', 'paths = ["README.md", 7]'))
    assert "[[commit]] #4 → paths[1]: expected a path or pattern" in result.err


@pytest.mark.parametrize("history", [
    '\n[[commit.history]]\nresponse = "keep going"',  # an array of tables
    '\n"hist\\u006Fry" = []',  # `history` to tomllib, spelled with an escape
])
def test_a_history_the_run_could_not_append_to_is_refused_before_anything(
        demo: Demo, history: str) -> None:
    edited(demo, 'paths = ["shop/discounts.py"]', f'paths = ["shop/discounts.py"]{history}')
    assert cli("status", str(demo.spec)).code == 0  # tomllib reads it; the spec is valid
    result = refused(demo)
    assert "[[commit]] #2 ('feat: discount codes'): retcon-sandbox cannot append to its " \
        "history as written" in result.err
    assert "`history = [...]`" in result.err and "Nothing was written" in result.err


def deep_spec(demo: Demo, tmp_path: Path) -> Path:
    """The demo's spec at a path of 4090 bytes: it can be read, but the temporary file a save
    makes beside it has a path longer than PATH_MAX (4096 bytes)."""
    directory = tmp_path / "deep"
    name = "spec.toml"
    while len(os.fsencode(directory)) + 1 + len(name) < 4090 - 201:
        directory /= "d" * 200
    directory /= "e" * (4090 - len(os.fsencode(directory)) - 2 - len(name))
    directory.mkdir(parents=True)
    spec = directory / name
    spec.write_bytes(demo.spec.read_bytes())
    assert len(os.fsencode(spec)) == 4090
    return spec


def test_a_spec_that_cannot_be_saved_is_refused_before_anything(demo: Demo,
                                                                tmp_path: Path) -> None:
    spec = deep_spec(demo, tmp_path)
    before = spec.read_bytes()
    result = cli("execute", str(spec), *LOCAL, cwd=demo.path)
    assert result.code == 1, result.out + result.err
    assert "cannot save" in result.err and "File name too long" in result.err
    assert "use a shorter path" in result.err and "Nothing was written" in result.err
    assert spec.read_bytes() == before and os.listdir(spec.parent) == ["spec.toml"]
    assert "feature-clean" not in git(demo.path, "branch", "--list")
    assert "Checking the base commit" not in result.out


def test_a_setup_input_that_matches_no_file_is_refused(demo: Demo) -> None:
    result = refused(edited(demo, "[sandbox]", '[sandbox]\nsetup = "true"\n'
                            'setup_inputs = ["requirements/nope*.txt"]'))
    assert "[sandbox] → setup_inputs: 'requirements/nope*.txt' match(es) no file" in result.err


@pytest.mark.parametrize(("flags", "named"), [
    (("--timeout", "100000"), "--timeout: must be from 1 to 86400"),
    (("--cpus", "5000"), "--cpus: must be from"),
    (("--pids", "10000000"), "--pids: must be from"),
    (("--memory", "abc"), "--memory: expected a size with a unit"),
    (("--memory", "9" * 400 + "g"), "--memory: must be from"),
    (("--tmp-size", "1k"), "--tmp-size: must be from"),
    (("--test", " "), "--test:"),
])
def test_a_refused_command_line_setting_is_a_usage_error_naming_the_option(
        demo: Demo, flags: tuple[str, ...], named: str) -> None:
    before = demo.spec.read_bytes()
    for command in (("execute", str(demo.spec), *LOCAL), ("verify", "--spec", str(demo.spec),
                                                          "--sandbox", "local")):
        result = cli(*command, *flags, cwd=demo.path)
        assert result.code == 2, result.out + result.err
        assert named in result.err and "internal error" not in result.err
    assert demo.spec.read_bytes() == before
    assert "feature-clean" not in git(demo.path, "branch", "--list")


def test_a_file_to_reconstruct_over_max_file_size_is_refused_before_anything(demo: Demo) -> None:
    """Found before the first commit, not when a later commit reaches it."""
    (demo.path / "data").mkdir()
    (demo.path / "data" / "big.bin").write_bytes(b"x" * 4096)
    git(demo.path, "checkout", "-q", "feature")
    git(demo.path, "add", "data/big.bin")
    git(demo.path, "commit", "-q", "-m", "big")
    git(demo.path, "checkout", "-q", "main")
    text = demo.spec.read_text().replace("[sandbox]", '[sandbox]\nmax_file_size = "2k"')
    text = text.replace('paths = ["README.md"', 'paths = ["data/big.bin", "README.md"')
    demo.spec.write_text(text)
    before = demo.spec.read_bytes()
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1, result.out + result.err
    assert "data/big.bin is 4096 bytes on the source branch, over the largest file the host " \
        "reads (2048 bytes)" in result.err
    assert demo.spec.read_bytes() == before
    assert "feature-clean" not in git(demo.path, "branch", "--list")


@pytest.mark.parametrize(("args", "said"), [
    (("verify", "main..feature", "--shard", "-1/2"), "argument --shard: expected K/N, like 2/3 "
     "(job K of N), got '-1/2'"),
    (("execute", "spec.toml", "--setup-disk", "-1g"), "argument --setup-disk: '-1g': expected "
     "a size with a unit"),
    (("verify", "main..feature", "--setup-disk", "-.5g"), "argument --setup-disk: '-.5g'"),
    (("execute", "spec.toml", "--timeout", "-5s"), "argument --timeout: expected a number of "
     "seconds, got '-5s'"),
    (("execute", "spec.toml", "--setup-timeout", "-1"), "argument --setup-timeout: expected a "
     "number greater than 0, got '-1'"),
])
def test_a_value_that_begins_with_a_minus_is_named_in_its_refusal(args: tuple[str, ...],
                                                                  said: str) -> None:
    """argparse took `-1g` for an unknown option and said only "expected one argument"."""
    result = cli(*args)
    assert result.code == 2, result.out + result.err
    assert said in result.err and "expected one argument" not in result.err
