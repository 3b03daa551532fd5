"""The model adapter: the one module that imports openai.

Chat Completions with function tools, which OpenAI, Azure, vLLM, Ollama and LiteLLM all speak.
The SDK's own retries are off: rate limits, timeouts, connection errors and 5xx are retried here
a bounded number of times, each retry announced; every other failure, and the last retry's, is a
`ModelError` that names the endpoint and the model. A model that cannot be used is an error of
configuration or of the service, never a stuck commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai
from openai.types.chat import ChatCompletion

from retcon_sandbox.errors import ModelError
from retcon_sandbox.text import escape_undecodable

RETRYABLE = (
    openai.RateLimitError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.InternalServerError,
)
PREFLIGHT = "retcon-sandbox preflight: reply with the word OK."
DEFAULT_URL = "https://api.openai.com/v1"


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
    timeout: float = 120.0

    @property
    def endpoint(self) -> str:
        return self.base_url or DEFAULT_URL


Notice = Callable[[str], None]


def backoff(attempt: int, max_wait: float) -> float:
    """Seconds to wait before retry `attempt` (2, 3, ...): 1, 2, 4, ... capped at max_wait."""
    return float(min(max_wait, 2 ** (attempt - 2)))


class OpenAIChat:
    def __init__(self, settings: ModelSettings, notice: Notice | None = None) -> None:
        self.name = settings.model
        self._settings = settings
        self._notice = notice or (lambda text: None)
        self._client = openai.OpenAI(base_url=settings.base_url,
                                     api_key=settings.api_key or "unused", max_retries=0,
                                     timeout=settings.timeout)

    def preflight(self) -> None:
        """One tiny request, before anything is written: a model that cannot be used stops the
        run here, with the endpoint, the model and a hint."""
        self.complete([{"role": "user", "content": PREFLIGHT}], [])

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        s = self._settings
        for attempt in range(1, s.attempts + 1):
            try:
                return self._once(messages, tools)
            except RETRYABLE as exc:
                if attempt == s.attempts:
                    raise self._error(exc, f"after {s.attempts} attempts") from None
                wait = backoff(attempt + 1, s.max_wait)
                self._notice(f"model endpoint {_why_retry(exc, s.timeout)}, retry "
                             f"{attempt + 1}/{s.attempts} in {wait:g} s…")
                time.sleep(wait)
            except openai.OpenAIError as exc:
                raise self._error(exc, "") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            response = self._client.chat.completions.create(
                model=self.name, messages=_encodable(messages), **extra)
        except json.JSONDecodeError as exc:  # declared JSON, but is not
            raise self._bad_answer(f"text that is not valid JSON ({exc.msg} at character "
                                   f"{exc.pos})") from None
        if not isinstance(response, ChatCompletion):
            raise self._bad_answer(_what_it_is(response))
        return _reply(response, self._bad_answer)

    def _where(self) -> str:
        return f"model {self.name!r} at {self._settings.endpoint}"

    def _bad_answer(self, what: str) -> ModelError:
        return ModelError(f"the model endpoint answered with {what} ({self._where()})",
                          "Check --base-url (or OPENAI_BASE_URL): it must be the API's base URL, "
                          "usually ending in /v1, of a server speaking OpenAI's Chat Completions "
                          "API.")

    def _error(self, exc: openai.OpenAIError, after: str) -> ModelError:
        where = self._where()
        suffix = f" {after}" if after else ""
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return ModelError(f"the model endpoint refused the API key (HTTP {exc.status_code}, "
                              f"{where})", "Check OPENAI_API_KEY for this endpoint.")
        if isinstance(exc, openai.NotFoundError):
            return ModelError(f"the model endpoint does not know this model or path (HTTP 404, "
                              f"{where})", "Check --model (or RETCON_SANDBOX_MODEL) and "
                              "--base-url (or OPENAI_BASE_URL).")
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(f"the model endpoint did not answer within "
                              f"{self._settings.timeout:g} s{suffix} ({where})",
                              "Raise --model-timeout (or RETCON_SANDBOX_MODEL_TIMEOUT) for a "
                              "slow model, or check that the endpoint is up.")
        if isinstance(exc, openai.APIConnectionError):
            return ModelError(f"cannot reach the model endpoint{suffix} ({where}): "
                              f"{_describe(exc)}", "Check --base-url (or OPENAI_BASE_URL) and "
                              "that the server is running and reachable.")
        if isinstance(exc, openai.APIResponseValidationError):
            return self._bad_answer("something that is not a chat completion")
        if isinstance(exc, openai.APIStatusError):
            return ModelError(f"the model endpoint failed{suffix}: {_describe(exc)} ({where})",
                              "Check the endpoint's status and your quota, then rerun: the "
                              "run resumes from the spec.")
        return ModelError(f"the model call failed{suffix}: {_describe(exc)} ({where})",
                          "Check the model settings, then rerun: the run resumes from the spec.")


def _encodable(value: Any) -> Any:
    """The messages, with every byte of a name that is not UTF-8 written `\\xNN` (the request
    is UTF-8 JSON); the tools map such a name back (`WorkState`)."""
    if isinstance(value, str):
        return escape_undecodable(value)
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    if isinstance(value, dict):
        return {key: _encodable(item) for key, item in value.items()}
    return value


def _why_retry(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return f"slow (no answer within {timeout:g} s)"
    if isinstance(exc, openai.RateLimitError):
        return "rate-limited (HTTP 429)"
    if isinstance(exc, openai.APIStatusError):
        return f"failing (HTTP {exc.status_code})"
    return "unreachable"


def _what_it_is(response: object) -> str:
    """What an endpoint answered instead of a chat completion, for the error message."""
    if isinstance(response, str):
        text = response.strip()
        if text.startswith("<"):
            return "an HTML page instead of a chat completion"
        return f"plain text instead of a chat completion: {text[:80]!r}"
    return "JSON that is not a chat completion"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        message = str(exc.message)
        if message == f"Error code: {exc.status_code}":  # no detail in the body
            return f"HTTP {exc.status_code}"
        return f"HTTP {exc.status_code}: {message[:300]}"
    cause = exc.__cause__ or exc.__context__
    detail = f" ({type(cause).__name__}: {cause})" if cause else ""
    return f"{type(exc).__name__}: {exc}{detail}"[:400]


def _reply(response: ChatCompletion, bad: Callable[[str], ModelError]) -> Reply:
    """The reply, from a response the SDK built without validating it: any shape that is not a
    chat completion is the endpoint's error, never a crash."""
    if not isinstance(response.choices, list) or not response.choices:
        raise bad("a chat completion with no choices")
    try:
        return _parse_reply(response)
    except (AttributeError, TypeError, ValueError) as exc:
        raise bad(f"a malformed chat completion ({exc})"[:300]) from None


def _parse_reply(response: ChatCompletion) -> Reply:
    message = response.choices[0].message
    if not isinstance(message.content, str | None):
        raise TypeError(f"message content is a {type(message.content).__name__}")
    calls = tuple(ToolCall(str(c.id), str(c.function.name), str(c.function.arguments or ""))
                  for c in (message.tool_calls or [])
                  if c.type == "function" and getattr(c, "function", None) is not None)
    usage = Usage(int(response.usage.prompt_tokens), int(response.usage.completion_tokens)) \
        if response.usage else Usage()
    as_dict: dict[str, Any] = {"role": "assistant", "content": message.content}
    if calls:
        as_dict["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return Reply(message.content, calls, usage, as_dict)
