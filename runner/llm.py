"""The model adapter: the one module that imports openai.

Chat Completions with function tools, which OpenAI, Azure, vLLM, Ollama and LiteLLM all speak.
The SDK's own retries are off; tenacity retries rate limits, timeouts, connection errors and
5xx a bounded number of times, then the failure becomes our `ModelError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import openai
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from runner.errors import ModelError

RETRYABLE = (
    openai.RateLimitError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.InternalServerError,
)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    message: dict[str, Any] = field(default_factory=dict)  # as it goes back into the history


class ChatModel(Protocol):
    name: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply: ...


@dataclass(frozen=True)
class ModelSettings:
    model: str
    base_url: str | None
    api_key: str | None
    attempts: int = 6
    max_wait: float = 20.0
    timeout: float = 300.0


class OpenAIChat:
    def __init__(self, settings: ModelSettings) -> None:
        self.name = settings.model
        self._settings = settings
        self._client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key or "unused",
            max_retries=0,
            timeout=settings.timeout,
        )

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        retrying = Retrying(
            retry=retry_if_exception_type(RETRYABLE),
            stop=stop_after_attempt(self._settings.attempts),
            wait=wait_exponential(multiplier=0.5, max=self._settings.max_wait),
            reraise=False,
        )
        try:
            response = retrying(self._client.chat.completions.create, model=self.name,
                                messages=messages, tools=tools)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise ModelError(f"the model endpoint kept failing after {self._settings.attempts} "
                             f"attempts: {_describe(last)}") from None
        except openai.APIStatusError as exc:
            raise ModelError(f"the model endpoint refused the request: {_describe(exc)}",
                             "Check --model, --base-url and OPENAI_API_KEY.") from None
        except openai.OpenAIError as exc:
            raise ModelError(f"the model call failed: {_describe(exc)}") from None
        return _reply(response)


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def _reply(response: Any) -> Reply:
    if not response.choices:
        raise ModelError("the model endpoint answered with no choices")
    message = response.choices[0].message
    calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments or "")
                  for c in (message.tool_calls or []) if c.type == "function")
    usage = Usage(response.usage.prompt_tokens, response.usage.completion_tokens) \
        if response.usage else Usage()
    as_dict: dict[str, Any] = {"role": "assistant", "content": message.content}
    if calls:
        as_dict["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return Reply(message.content, calls, usage, as_dict)
