"""A streaming model: its answer put together from the pieces OpenAI's server-sent events
bring, its tokens counted for the progress lines as they come; an endpoint that does not stream
or refuses `stream_options` is asked without streaming; RETCON_SANDBOX_MODEL_STREAM=0 turns it
off."""

from __future__ import annotations

import pytest

from retcon_sandbox import progress
from retcon_sandbox.model.llm import OpenAIChat
from retcon_sandbox.model.settings import ModelSettings
from tests.fake_openai import FakeOpenAI, call
from tests.test_progress import Collector

HI = [{"role": "user", "content": "hi"}]


def chat(url: str) -> OpenAIChat:
    return OpenAIChat(ModelSettings("fake-model", url, "key", attempts=2, max_wait=0.01))


def test_a_streamed_answer_is_put_together_and_its_tokens_counted() -> None:
    arguments = {"path": "shop/cart.py", "content": "x = 1\n" * 20}
    script = [[call("write_file", **arguments), call("run_build")], "hello, streamed world"]
    report = Collector()
    with FakeOpenAI(script, streams=True) as model:  # type: ignore[arg-type]
        with progress.phase(report, "model", 1):
            reply = chat(model.base_url).complete(HI, [])
        text = chat(model.base_url).complete(HI, [])
        sent = model.requests
    assert [c.name for c in reply.tool_calls] == ["write_file", "run_build"]
    assert reply.tool_calls[0].arguments == call("write_file", **arguments).arguments
    assert reply.usage.total == 120  # the last chunk's usage
    assert reply.message["tool_calls"][0]["function"]["name"] == "write_file"
    assert text.content == "hello, streamed world" and text.tool_calls == ()
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True}
               for b in sent)
    end = report.named("phase_end")[0]
    assert end["tokens"] > 10  # a piece of a few characters each


def test_the_heartbeat_shows_the_tokens_streamed_so_far() -> None:
    report = Collector(lambda event, data: event == "heartbeat" and data.get("tokens"))
    with FakeOpenAI(["a fairly long answer, streamed three characters at a time " * 4],
                    streams=True, chunk_delay=0.05) as model, \
            progress.heartbeat(report, every=0.05), progress.phase(None, "model", 4):
        chat(model.base_url).complete(HI, [])
    assert report.seen.is_set()
    beat = next(b for b in report.named("heartbeat") if b.get("tokens"))
    assert beat["what"] == "#4 model" and progress.line(beat).endswith(" tokens streamed")


def test_a_server_that_refuses_stream_options_is_asked_without_streaming() -> None:
    with FakeOpenAI(["first", "second"], refuse=("stream_options",)) as model:
        c = chat(model.base_url)
        assert c.complete(HI, []).content == "first"
        assert c.complete(HI, []).content == "second"
        sent = model.requests
    assert model.refused == ["stream_options"]
    assert [("stream" in b, "stream_options" in b) for b in sent] == [(False, False)] * 2


def test_streaming_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from retcon_sandbox.commands.options import ModelOptions

    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("RETCON_SANDBOX_MODEL_STREAM", "0")
    settings = ModelOptions("fake-model", None).settings()
    assert settings is not None and settings.stream is False
    with FakeOpenAI(["whole"], streams=True) as model:
        assert OpenAIChat(replace(settings, base_url=model.base_url)).complete(HI, []).content \
            == "whole"
        assert "stream" not in model.requests[0]
