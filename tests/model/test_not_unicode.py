"""Text that is not valid Unicode: a model's JSON may hold a lone surrogate (`\\ud800`, an escape
without its pair), a terminal that is not UTF-8 sends bytes Python reads as surrogates. Where the
text must be exact (a file's path or content, a commit message, a plan's hints) the model is told
and can correct it; where it only reports (a stuck summary, a reason, a typed note) the spec
records it with U+FFFD. Never a crash."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.conftest import cli, cli_at_terminal, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Step, call

LOCAL = ("--sandbox", "local", "--non-interactive")


TWO_COMMITS = """source = "feature"
remote = "main"
cleaned = "feature-clean"
[sandbox]
build = "true"
[[commit]]
message = "first"
hints = "whatever main already has"
[[commit]]
message = "second"
hints = "everything"
"""


def test_a_stuck_summary_and_a_reason_with_lone_surrogates_are_recorded(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False, spec_text=TWO_COMMITS)
    script: list[Step] = [[call("nothing_to_extract", reason="held by main \ud83d")],
                          [call("report_stuck", summary="can't \ud800 do \x1b[2J it")]]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 3, result.out + result.err
    assert "internal error" not in result.err
    text = demo.spec.read_text(encoding="utf-8")
    assert '{ nothing_to_extract = "held by main \ufffd" }' in text
    assert '{ stuck = "can\'t \ufffd do \\u001b[2J it" }' in text
    assert "\x1b" not in result.out + result.err  # shown sanitised
    tomllib.loads(text)


def test_a_path_content_or_message_with_a_lone_surrogate_is_an_error_the_model_sees(
        tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    script: list[Step] = [[call("write_file", path="shop/a\ud800.py", content="x = 1\n")],
                          [call("write_file", path="shop/a.py", content="x = '\ud800'\n")],
                          [call("read_file", path="\udfff")],
                          [call("write_file", path="shop/a.py", content="x = 1\n")],
                          [call("create_commit", message="add \ud800")],
                          [call("report_stuck", summary="stop here")]]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 3, result.out + result.err
    assert "internal error" not in result.err
    assert "the path holds a lone surrogate (U+D800 at character 7)" in results[0]
    assert "the content holds a lone surrogate (U+D800 at character 6)" in results[1]
    assert "the path holds a lone surrogate (U+DFFF at character 1)" in results[2]
    assert "message holds a lone surrogate (U+D800 at character 5)" in results[4]
    assert '{ stuck = "stop here" }' in demo.spec.read_text()
    assert demo.git("log", "--format=%s", "main..feature-clean") == ""


def test_a_proposal_with_lone_surrogates_is_an_error_the_model_sees(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    script: list[Step] = [
        [call("propose_commit", message="docs", paths=["README.md"], hints="\ud800")],
        [call("propose_commit", message="docs \udc00", paths=["README.md"])],
        [call("finish_plan")]]
    with FakeOpenAI(script) as model:
        result = cli("plan", "--source", "feature", "--sandbox", "local", "-o", "spec.toml",
                     cwd=demo.path, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 0, result.out + result.err
    assert "hints holds a lone surrogate (U+D800 at character 1)" in results[0]
    assert "message holds a lone surrogate (U+DC00 at character 6)" in results[1]
    tomllib.loads((demo.path / "spec.toml").read_text(encoding="utf-8"))


def test_a_note_typed_on_a_terminal_that_is_not_utf8_is_recorded(tmp_path: Path) -> None:
    """"café" typed in Latin-1: the note is recorded, its byte written U+FFFD; the summary the
    prompt shows is sanitised."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    text = demo.spec.read_text()
    first = 'paths = ["shop/validation.py"'
    assert first in text
    demo.spec.write_text(text.replace(
        first, 'history = ["started", { stuck = "help \\u001b[2J me" }]\n' + first, 1))
    result = cli_at_terminal("execute", str(demo.spec), "--sandbox", "local",
                             "--build", "true", "--test", "true",  # the note matters, not tests
                             typed=b"caf\xe9\n")
    assert result.code == 0, result.out + result.err
    assert "Type a resolution note" in result.out and "\x1b" not in result.out
    assert "is stuck: help \\e[2J me" in result.out
    assert '{ resolved = "caf\ufffd" }' in demo.spec.read_text(encoding="utf-8")
