"""The retry policy (tenacity): what is retried (429, 5xx, connection errors; never a 400), how
long each wait is (the endpoint's Retry-After, in seconds or as an HTTP date, else a capped
backoff, with jitter), and the overall deadline; and what the preflight checks: tool calling."""

from __future__ import annotations

import email.utils
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from retcon_sandbox.errors import ModelError
from retcon_sandbox.model.llm import OpenAIChat, retry_after
from retcon_sandbox.model.settings import ModelSettings
from tests.conftest import cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Fault, Step

LOCAL = ("--sandbox", "local", "--non-interactive")
HI = [{"role": "user", "content": "hi"}]


def chat(url: str, notices: list[str], **settings: float) -> OpenAIChat:
    values = {"attempts": 3, "max_wait": 0.01, "timeout": 30.0, **settings}
    return OpenAIChat(ModelSettings("fake-model", url, "key", attempts=int(values["attempts"]),
                                    max_wait=values["max_wait"], timeout=values["timeout"],
                                    deadline=values.get("deadline", 600.0)), notices.append)


def test_retry_after_in_seconds_is_honoured_with_jitter() -> None:
    notices: list[str] = []
    with FakeOpenAI([Fault(429, headers=(("Retry-After", "1"),)), "hello"]) as model:
        reply = chat(model.base_url, notices).complete(HI, [])
    assert reply.content == "hello"
    assert len(notices) == 1, notices
    assert re.fullmatch(r"model endpoint rate-limited \(HTTP 429\), retry 2/3 in 1\.[0-3] s "
                        r"\(as its Retry-After asks\)…", notices[0]), notices


def test_a_5xx_is_retried_with_the_backoff() -> None:
    notices: list[str] = []
    with FakeOpenAI([Fault(503), Fault(500), "hello"]) as model:
        reply = chat(model.base_url, notices).complete(HI, [])
    assert reply.content == "hello" and len(notices) == 2
    assert "failing (HTTP 503), retry 2/3 in 0.0 s…" in notices[0]


@pytest.mark.parametrize("status", [400, 422])
def test_a_request_the_endpoint_refuses_is_not_retried(status: int) -> None:
    notices: list[str] = []
    with FakeOpenAI([Fault(status, "bad request"), "never"]) as model:
        with pytest.raises(ModelError, match=f"HTTP {status}"):
            chat(model.base_url, notices).complete(HI, [])
        assert model.remaining == 1
    assert notices == []


def test_no_retry_ends_past_the_deadline() -> None:
    notices: list[str] = []
    with FakeOpenAI([Fault(429, headers=(("Retry-After", "3600"),)), "never"]) as model:
        with pytest.raises(ModelError) as raised:
            chat(model.base_url, notices, deadline=600).complete(HI, [])
        assert model.remaining == 1
    assert notices == []
    assert raised.value.message.startswith("the model endpoint failed: HTTP 429: ")
    assert raised.value.message.endswith(
        "). It was not tried again: the wait before another try would end more than 600 s "
        "after the first one (the deadline, RETCON_SANDBOX_MODEL_DEADLINE)")


def test_a_deadline_after_several_attempts_reads_as_a_sentence() -> None:
    notices: list[str] = []
    script: list[Step] = [Fault(503), Fault(429, headers=(("Retry-After", "3600"),)), "never"]
    with FakeOpenAI(script) as model, pytest.raises(ModelError) as raised:
        chat(model.base_url, notices, deadline=10).complete(HI, [])
    message = raised.value.message
    assert message.startswith("the model endpoint failed after 2 attempts: HTTP 429: ")
    assert "failed a retry" not in message and ";" not in message
    assert message.endswith("more than 10 s after the first one (the deadline, "
                            "RETCON_SANDBOX_MODEL_DEADLINE)")


def headers(**values: str) -> SimpleNamespace:
    return SimpleNamespace(response=SimpleNamespace(headers=values))


def test_retry_after_as_seconds_an_http_date_or_milliseconds() -> None:
    now = time.time()
    assert retry_after(headers(**{"retry-after": "7"})) == 7
    date = email.utils.formatdate(now + 30, usegmt=True)
    waited = retry_after(headers(**{"retry-after": date}), now=now)
    assert waited is not None and 29 <= waited <= 30
    assert retry_after(headers(**{"retry-after": email.utils.formatdate(now - 60, usegmt=True)}),
                       now=now) == 0
    assert retry_after(headers(**{"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert retry_after(headers(**{"retry-after": "soon"})) is None
    assert retry_after(headers()) is None
    assert retry_after(ValueError("no response")) is None


@pytest.mark.slow
def test_a_server_without_tool_calling_fails_in_the_preflight(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    before = demo.spec.read_bytes()
    with FakeOpenAI([], tools=False) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 1, result.out + result.err
    assert "the model endpoint refuses requests that offer tools (HTTP 400: " \
        "registry.ollama.ai/library/fake-model does not support tools)" in result.err
    assert "tool (function) calls" in result.err
    assert demo.spec.read_bytes() == before
    assert "feature-clean" not in demo.git("branch", "--list")


@pytest.mark.slow
def test_an_ollama_endpoint_gets_a_warning_about_its_context(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    with FakeOpenAI([]) as model:
        url = model.base_url.replace("/v1", "/api/v1")
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(url))
        again = make_demo(tmp_path / "again", with_paths=True)
        as_json = cli("execute", str(again.spec), *LOCAL, "--json", env=llm_env(url))
        plain = cli("status", str(demo.spec), env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert result.err.count("looks like Ollama") == 1 and "Ollama" not in result.out
    assert "OLLAMA_CONTEXT_LENGTH" in result.err and "num_ctx" in result.err
    assert as_json.code == 0, as_json.out + as_json.err
    assert as_json.err.count("looks like Ollama") == 1
    warnings = [json.loads(line) for line in as_json.out.splitlines() if '"warning"' in line]
    assert any("looks like Ollama" in w["message"] for w in warnings)
    assert "Ollama" not in plain.out + plain.err
