"""Settings no HTTP request could carry (a base URL the HTTP stack refuses, an API key no header
can hold, a model name that is not text) are refused before the first request with a message
that says which setting is wrong; the API key is never printed, whatever fails."""

from __future__ import annotations

import pytest

from retcon_sandbox.errors import ModelError
from retcon_sandbox.model.llm import OpenAIChat, redact_key
from retcon_sandbox.model.settings import ModelSettings
from tests.conftest import Demo, cli, make_demo
from tests.fake_openai import FakeOpenAI, Fault, call

LOCAL = ("--sandbox", "local", "--non-interactive")
SECRET = "sk-secret-abc"


@pytest.fixture
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return make_demo(tmp_path_factory.mktemp("repo"), with_paths=False)


@pytest.mark.parametrize(("key", "what"), [
    (SECRET + "\u2019", "character 14 of 14 is not ASCII (U+2019"),
    (SECRET + "\n", "character 14 of 14 is a line break"),
    ("sk-se cret", "character 6 of 10 is a space"),
    (SECRET + "\udcff", "character 14 of 14 is a byte that is not UTF-8"),
])
def test_an_api_key_no_header_can_carry_is_refused_unprinted(demo: Demo, key: str,
                                                             what: str) -> None:
    with FakeOpenAI([[call("report_stuck", summary="x")]]) as model:
        env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": model.base_url,
               "RETCON_SANDBOX_MODEL": "m"}
        result = cli("execute", str(demo.spec), *LOCAL, env=env)
        sent = model.requests
    assert result.code == 1, result.out + result.err
    assert f"OPENAI_API_KEY cannot be sent: {what}" in result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    assert SECRET not in result.out + result.err and "sk-se" not in result.err
    assert not sent  # refused before the first request


def test_a_model_name_that_is_not_utf8_is_a_usage_error(demo: Demo) -> None:
    result = cli("execute", str(demo.spec), *LOCAL, "--model", "m\udcff", "--base-url",
                 "http://127.0.0.1:9/v1")
    assert result.code == 2, result.out + result.err
    assert "--model 'm\\xff' is not UTF-8 text" in result.err
    env = {"RETCON_SANDBOX_MODEL": "m\udcff", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    result = cli("execute", str(demo.spec), *LOCAL, env=env)
    assert result.code == 2 and "RETCON_SANDBOX_MODEL 'm\\xff' is not UTF-8" in result.err


def test_the_adapter_never_reports_the_key_the_http_stack_refuses() -> None:
    """What the settings' checks would refuse, given to the adapter directly: the HTTP client
    refuses the header, and the error says so without the key."""
    with FakeOpenAI([]) as model:
        chat = OpenAIChat(ModelSettings("m", model.base_url, SECRET + "\n", attempts=1))
        with pytest.raises(ModelError) as raised:
            chat.preflight()
    assert SECRET not in str(raised.value) and SECRET not in raised.value.message


@pytest.mark.parametrize("url", ["http://a..b/v1", "http://[::1]x/v1",
                                 "http://h/" + "p" * 70_000, "http://h\udcff/v1"])
def test_the_adapter_turns_a_url_the_client_refuses_into_a_model_error(url: str) -> None:
    with pytest.raises(ModelError, match="cannot be used as configured") as raised:
        OpenAIChat(ModelSettings("m", url, "key", attempts=1, timeout=2)).preflight()
    assert "Check --base-url" in raised.value.hint


def test_redaction_hides_bearer_credentials_and_the_key() -> None:
    text = "Illegal header value b'Bearer sk-secret-abc\\n' (key sk-secret-abc)"
    assert redact_key(text, SECRET) == "Illegal header value b'Bearer ***' (key ***)"
    assert redact_key("authorization: bearer abc.def", None) == "authorization: bearer ***"


def test_the_adapter_turns_a_timeout_the_clock_cannot_hold_into_a_model_error() -> None:
    with FakeOpenAI([]) as model, pytest.raises(ModelError, match="OverflowError"):
        OpenAIChat(ModelSettings("m", model.base_url, "key", attempts=1, timeout=1e300)
                   ).preflight()


@pytest.mark.parametrize("key", ["k", "ke", "ey", "e", "PI"])
def test_a_short_key_is_hidden_only_where_it_stands_alone(key: str) -> None:
    """A key shorter than the words around it does not turn "API key" into `API ***ey`."""
    text = "the model endpoint refused the API key (HTTP 401)"
    assert redact_key(text, key) == text
    assert redact_key(f"sent {key} as the key", key) == "sent *** as the key"


def test_a_short_key_in_the_message_of_a_refused_key_leaves_its_words_whole() -> None:
    refused = Fault(401, "Incorrect API key provided: k")
    with FakeOpenAI([], preflight=refused) as model, pytest.raises(ModelError) as raised:
        OpenAIChat(ModelSettings("m", model.base_url, "k", attempts=1)).preflight()
    assert "refused the API key (HTTP 401" in raised.value.message
    assert "***ey" not in raised.value.message
