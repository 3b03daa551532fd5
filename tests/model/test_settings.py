"""Model settings a user expects: the model and its sampling from the spec's `[model]` table, the
command line winning; the endpoint and the key never from a spec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from retcon_sandbox.errors import ModelError
from retcon_sandbox.model.llm import OpenAIChat
from retcon_sandbox.model.settings import ModelSettings
from tests.conftest import Demo, cli, make_demo
from tests.fake_openai import FakeOpenAI, Fault
from tests.scripts import reconstruction

LOCAL = ("--sandbox", "local", "--non-interactive")
TABLE = '\n[model]\nname = "fake-model"\ntemperature = 0.2\nmax_tokens = 900\nseed = 7\n'


def with_table(tmp_path: Path, table: str) -> Demo:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    demo.spec.write_text(demo.spec.read_text() + table)
    return demo


@pytest.mark.slow
@pytest.mark.parametrize(("options", "expected"), [
    ((), {"model": "fake-model", "temperature": 0.2, "max_tokens": 900, "seed": 7}),
    (("--temperature", "0", "--seed", "3", "--max-tokens", "4000", "--model", "other"),
     {"model": "other", "temperature": 0, "max_tokens": 4000, "seed": 3}),
])
def test_the_spec_names_the_model_and_the_command_line_wins(
        tmp_path: Path, options: tuple[str, ...], expected: dict[str, object]) -> None:
    demo = with_table(tmp_path, TABLE)
    with FakeOpenAI(reconstruction()) as model:
        env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "k"}
        result = cli("execute", str(demo.spec), *LOCAL, *options, env=env)
        sent = model.requests
    assert result.code == 0, result.out + result.err
    assert sent and all({key: body.get(key) for key in expected} == expected for body in sent)


@pytest.mark.slow
def test_without_settings_nothing_is_sent(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction()) as model:
        env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "k",
               "RETCON_SANDBOX_MODEL": "fake-model"}
        assert cli("execute", str(demo.spec), *LOCAL, env=env).code == 0
        assert not any({"temperature", "max_tokens", "seed"} & set(b) for b in model.requests)


@pytest.mark.parametrize(("table", "message"), [
    ('base_url = "http://attacker.example/v1"', "[model] → base_url: the endpoint is chosen on "
     "the command line only (--base-url or OPENAI_BASE_URL)"),
    ('api_key = "sk-x"', "[model] → api_key: the API key comes from OPENAI_API_KEY only"),
    ('nmae = "x"', "[model] → nmae: unknown key; did you mean `name`?"),
    ("temperature = 3", "[model] → temperature: must be from 0 to 2"),
    ("max_tokens = 1.5", "[model] → max_tokens: expected a whole number"),
    ('seed = "7"', "[model] → seed: expected a whole number"),
    ('name = ""', "[model] → name: expected a non-empty string"),
])
def test_model_table_keys_are_checked(tmp_path: Path, table: str, message: str) -> None:
    demo = with_table(tmp_path, f"\n[model]\n{table}\n")
    before = demo.spec.read_bytes()
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1, result.out + result.err
    assert f"history-spec.toml: {message}" in result.err
    assert demo.spec.read_bytes() == before


@pytest.mark.parametrize(("option", "value"), [
    ("--temperature", "3"), ("--temperature", "-0.5"), ("--temperature", "hot"),
    ("--max-tokens", "0"), ("--seed", "-1"), ("--seed", "1.5"),
])
def test_model_options_are_checked(tmp_path: Path, option: str, value: str) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    result = cli("execute", str(demo.spec), *LOCAL, option, value)
    assert result.code == 2, result.out + result.err
    assert f"argument {option}:" in result.err


# --- the reply-length parameter's name --------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


def token_chat(url: str, **settings: object) -> OpenAIChat:
    return OpenAIChat(ModelSettings("fake-model", url, "key", attempts=2, max_wait=0.01,
                                    max_tokens=500, **settings))  # type: ignore[arg-type]


def test_a_refused_max_tokens_is_sent_again_as_max_completion_tokens_for_the_run() -> None:
    """OpenAI's reasoning models refuse `max_tokens`: the same request goes again with the
    other name, once, and every later request uses it from the start."""
    with FakeOpenAI(["first", "second"], refuse=("max_tokens",)) as model:
        chat = token_chat(model.base_url)
        chat.preflight()
        assert chat.complete(HI, []).content == "first"
        assert chat.complete(HI, []).content == "second"
        sent = model.requests
    assert model.refused == ["max_tokens"]  # learned at the preflight, never refused again
    assert [b.get("max_completion_tokens") for b in sent] == [500, 500]
    assert not any("max_tokens" in b for b in sent)


def test_a_server_that_refuses_the_new_name_gets_max_tokens() -> None:
    with FakeOpenAI(["hello"], refuse=("max_completion_tokens",)) as model:
        chat = token_chat(model.base_url, tokens_name="max_completion_tokens")
        assert chat.complete(HI, []).content == "hello"
        sent = model.requests
    assert model.refused == ["max_completion_tokens"]
    assert [b.get("max_tokens") for b in sent] == [500]


def test_a_server_that_refuses_both_names_is_an_error_after_one_more_try() -> None:
    with FakeOpenAI(["never"], refuse=("max_tokens", "max_completion_tokens")) as model:
        with pytest.raises(ModelError, match="Unsupported parameter: 'max_completion_tokens'"):
            token_chat(model.base_url).complete(HI, [])
        assert model.refused == ["max_tokens", "max_completion_tokens"]
        assert model.remaining == 1


def test_another_bad_request_is_not_sent_again() -> None:
    with FakeOpenAI([Fault(400, "Unsupported value: 'temperature' does not support 0.2"),
                     "never"]) as model:
        with pytest.raises(ModelError, match="HTTP 400"):
            token_chat(model.base_url).complete(HI, [])
        assert model.remaining == 1 and model.refused == []


@pytest.mark.slow
def test_max_tokens_on_a_reasoning_model_goes_through(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction(), refuse=("max_tokens",)) as model:
        env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "k",
               "RETCON_SANDBOX_MODEL": "fake-model"}
        result = cli("execute", str(demo.spec), *LOCAL, "--max-tokens", "4000", env=env)
        sent = model.requests
    assert result.code == 0, result.out + result.err
    assert model.refused == ["max_tokens"]
    assert sent and all(b.get("max_completion_tokens") == 4000 for b in sent)


def test_the_settings_are_read_without_importing_openai() -> None:
    """Reading and checking the model's settings leaves openai (about a second of CPU) to the
    adapter, which `execute` imports in a thread meanwhile; the adapter brings it."""
    probe = ("import os, sys\n"
             "os.environ['OPENAI_API_KEY'] = 'k'\n"
             "from retcon_sandbox.commands import execute\n"
             "from retcon_sandbox.commands.options import ModelOptions\n"
             "settings = ModelOptions('m', None, None, None, None, None).settings()\n"
             "print(settings.model, 'openai' in sys.modules)\n"
             "from retcon_sandbox.model import llm\n"
             "print(llm.OpenAIChat.__name__, 'openai' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["m False", "OpenAIChat True"]
