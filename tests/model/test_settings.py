"""Model settings a user expects: the model and its sampling from the spec's `[model]` table, the
command line winning; the endpoint and the key never from a spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Demo, cli, make_demo
from tests.fake_openai import FakeOpenAI
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
