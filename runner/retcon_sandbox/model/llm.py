"""The model adapter: the one module that imports openai.

Chat Completions with function tools, which OpenAI, Azure, vLLM, Ollama and LiteLLM all speak.
The SDK's own retries are off: rate limits (429), timeouts, connection errors and 5xx are
retried here by tenacity, each retry announced: at most `attempts` attempts, each wait the
endpoint's `Retry-After` (seconds or an HTTP date) when it gives one, else an exponential backoff
capped at `max_wait`, with jitter; and no retry whose wait would end past `deadline` seconds
after the first attempt. Nothing else is retried (a 400 is an answer). Every other failure, and
the last retry's, is a `ModelError` that names the endpoint and the model. A model that cannot be
used is an error of configuration or of the service, never a stuck commit.
"""

from __future__ import annotations

import email.utils
import functools
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai
import tenacity
from openai.types.chat import ChatCompletion

from retcon_sandbox import progress
from retcon_sandbox.errors import ModelError
from retcon_sandbox.model.settings import ModelSettings
from retcon_sandbox.text import encodable, plain_number

RETRYABLE = (
    openai.RateLimitError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.InternalServerError,
)
PREFLIGHT = "retcon-sandbox preflight: reply with the word OK."
# The preflight offers a tool, as every step does: a server without tool calling fails there.
PREFLIGHT_TOOLS = [{"type": "function", "function": {
    "name": "ready", "description": "Say that you are ready (optional).",
    "parameters": {"type": "object", "properties": {}}}}]
# The reply-length parameter's two names, each to the other: Chat Completions' older
# `max_tokens`, which OpenAI's reasoning models refuse, and its successor, which some
# OpenAI-compatible servers do not know yet.
TOKEN_NAMES = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}


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


Notice = Callable[[str], None]


def backoff(attempt: int, max_wait: float) -> float:
    """Seconds to wait before retry `attempt` (2, 3, ...): 1, 2, 4, ... capped at max_wait."""
    return float(min(max_wait, 2 ** (attempt - 2)))


def retry_after(exc: object, now: float | None = None) -> float | None:
    """The seconds an HTTP error's `Retry-After` (or OpenAI's `retry-after-ms`) asks for."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RetryPolicy:
    """When to retry and how long to wait, for tenacity: the wait of each retry is planned once
    (Retry-After, else backoff, plus up to a quarter of jitter), and a retry whose wait would
    end past the deadline is not made."""

    def __init__(self, settings: ModelSettings, jitter: Callable[[], float] = random.random
                 ) -> None:
        self._settings = settings
        self._jitter = jitter
        self._planned: dict[int, float] = {}

    def wait(self, state: tenacity.RetryCallState) -> float:
        attempt = state.attempt_number
        if attempt not in self._planned:
            exc = state.outcome.exception() if state.outcome else None
            asked = retry_after(exc) if exc is not None else None
            base = asked if asked is not None else backoff(attempt + 1, self._settings.max_wait)
            self._planned[attempt] = base + base * 0.25 * self._jitter()
        return self._planned[attempt]

    def stop(self, state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= self._settings.attempts:
            return True
        return (state.seconds_since_start or 0.0) + self.wait(state) > self._settings.deadline


class OpenAIChat:
    def __init__(self, settings: ModelSettings, notice: Notice | None = None) -> None:
        self.name = settings.model
        self._settings = settings
        self._notice = notice or (lambda text: None)
        self._last_error: openai.OpenAIError | None = None
        self._tokens_name = settings.tokens_name  # learned from a refusal, for the run
        self._tokens_learned = False
        self._stream = settings.stream  # likewise
        try:
            self._client = openai.OpenAI(base_url=settings.base_url,
                                         api_key=settings.api_key or "unused", max_retries=0,
                                         timeout=settings.timeout)
        except _client_errors() as exc:
            raise self._unusable(exc) from None

    def preflight(self) -> None:
        """One tiny request that offers a tool, before anything is written: a model that cannot
        be used stops the run here, with the endpoint, the model and a hint. A request refused
        (400, 422) only because it offers tools says so."""
        messages = [{"role": "user", "content": PREFLIGHT}]
        try:
            self.complete(messages, PREFLIGHT_TOOLS)
        except ModelError:
            refused = self._last_error
            if not isinstance(refused, openai.BadRequestError | openai.UnprocessableEntityError):
                raise
            self.complete(messages, [])  # fails on its own if it is not about the tools
            raise self._redacted(ModelError(
                f"the model endpoint refuses requests that offer tools (HTTP "
                f"{refused.status_code}: {_body_message(refused)}) ({self._where()})",
                "retcon-sandbox works through tool (function) calls: choose a model and server "
                "that support them (Ollama: a model with the `tools` capability; vLLM: "
                "--enable-auto-tool-choice and a --tool-call-parser).")) from None

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        policy = RetryPolicy(self._settings)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(RETRYABLE), wait=policy.wait,
            stop=policy.stop, before_sleep=self._announce, reraise=True)
        self._last_error = None
        try:
            return retrying(self._once, messages, tools)
        except openai.OpenAIError as exc:
            self._last_error = exc
            raise self._redacted(self._failed(exc, retrying)) from None
        except _client_errors() as exc:
            raise self._unusable(exc) from None

    def _unusable(self, exc: Exception) -> ModelError:
        """The HTTP client refused the URL or a header (what the settings' checks missed)."""
        return self._redacted(ModelError(
            f"the model endpoint cannot be used as configured ({self._where()}): "
            f"{type(exc).__name__}: {_first_line(exc)}",
            "Check --base-url (or OPENAI_BASE_URL): it must be the API's base URL, such as "
            "http://localhost:11434/v1; that OPENAI_API_KEY is the key alone; and that "
            "--model-timeout (or RETCON_SANDBOX_MODEL_TIMEOUT) is a sane number of seconds."))

    def _redacted(self, error: ModelError) -> ModelError:
        """The error with no trace of the API key (an exception's text may quote the header)."""
        error.message = redact_key(error.message, self._settings.api_key)
        error.args = (error.message,)
        return error

    def _failed(self, exc: openai.OpenAIError, retrying: tenacity.Retrying) -> ModelError:
        """The error; for one the policy retries, how often it was tried and, when attempts
        were left, why no more were made (a sentence of its own after the endpoint)."""
        if not isinstance(exc, RETRYABLE):
            return self._error(exc, "")
        attempts = int(retrying.statistics.get("attempt_number", 1))
        error = self._error(exc, f"after {attempts} attempts" if attempts > 1 else "")
        if attempts < self._settings.attempts:
            deadline = plain_number(self._settings.deadline)
            error.message += (f". It was not tried again: the wait before another try would end "
                              f"more than {deadline} s after the first one "
                              "(the deadline, RETCON_SANDBOX_MODEL_DEADLINE)")
            error.args = (error.message,)
        return error

    def _announce(self, state: tenacity.RetryCallState) -> None:
        s = self._settings
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        asked = " (as its Retry-After asks)" if exc is not None and retry_after(exc) else ""
        self._notice(f"model endpoint {_why_retry(exc, s.timeout)}, retry "
                     f"{state.attempt_number + 1}/{s.attempts} in {wait:.1f} s{asked}…")

    def _once(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        s = self._settings
        sampling = {"temperature": s.temperature, self._tokens_name: s.max_tokens,
                    "seed": s.seed}
        extra.update({key: value for key, value in sampling.items() if value is not None})
        if self._stream:
            extra.update(stream=True, stream_options={"include_usage": True})
        try:
            response = self._create(messages, extra)
            if isinstance(response, openai.Stream):
                return self._read_stream(response)
        except json.JSONDecodeError as exc:  # declared JSON, but is not
            raise self._bad_answer(f"text that is not valid JSON ({exc.msg} at character "
                                   f"{exc.pos})") from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, _client_errors()):  # older SDKs wrap what the client refused:
                raise self._unusable(cause) from None  # no connection was tried, none will be
            raise
        if not isinstance(response, ChatCompletion):
            raise self._bad_answer(_what_it_is(response))
        return _reply(response, self._bad_answer)

    def _create(self, messages: list[dict[str, Any]], extra: dict[str, Any]) -> object:
        """One request; a refusal of one of our conventions is answered by one more request
        without it, which the rest of the run keeps (`_learn`)."""
        while True:
            try:
                return self._client.chat.completions.create(  # a name that is not UTF-8
                    model=self.name, messages=encodable(messages), **extra)  # as `\xNN`
            except openai.BadRequestError as exc:
                learned = self._learn(exc, extra)
                if learned is None:
                    raise
                extra = learned

    def _learn(self, exc: openai.BadRequestError, extra: dict[str, Any]
               ) -> dict[str, Any] | None:
        """The request again, without what the endpoint refused, once per convention: the
        reply-length parameter's name (OpenAI's reasoning models refuse `max_tokens`, older
        servers `max_completion_tokens`), and streaming (a server that does not stream, or
        does not know `stream_options`). None when the refusal is about something else."""
        sent = self._tokens_name
        if sent in extra and not self._tokens_learned and _refuses(exc, sent):
            self._tokens_learned = True
            self._tokens_name = TOKEN_NAMES[sent]
            changed = {key: value for key, value in extra.items() if key != sent}
            changed[self._tokens_name] = self._settings.max_tokens
            return changed
        if "stream" in extra and (_refuses(exc, "stream_options") or _refuses(exc, "stream")):
            self._stream = False
            return {key: value for key, value in extra.items()
                    if key not in ("stream", "stream_options")}
        return None

    def _read_stream(self, stream: openai.Stream[Any]) -> Reply:
        """A streamed answer, put together as it comes (the tokens so far told to
        progress.streamed), within the timeout for the whole answer; an endpoint that answered
        without streaming is read as a plain answer."""
        response = stream.response
        if "text/event-stream" not in response.headers.get("content-type", ""):
            return self._plain_answer(response)
        deadline = time.monotonic() + self._settings.timeout
        parts = _Parts()
        try:
            for chunk in stream:
                parts.add(chunk)
                progress.streamed(parts.count)
                if time.monotonic() > deadline:
                    raise openai.APITimeoutError(request=response.request)
        except _transport_errors() as exc:  # older SDKs let the HTTP client's errors through
            raise openai.APIConnectionError(request=response.request) from exc
        finally:
            stream.close()
        try:
            return parts.reply()
        except (AttributeError, TypeError, ValueError) as exc:
            raise self._bad_answer(f"a malformed chat completion stream ({exc})"[:300]
                                   ) from None

    def _plain_answer(self, response: Any) -> Reply:
        """What the SDK makes of an answer that is not a stream: JSON becomes the completion
        (not validated, as the SDK's own), anything else text."""
        response.read()
        if "json" not in response.headers.get("content-type", ""):
            raise self._bad_answer(_what_it_is(response.text))
        data = json.loads(response.text)
        if not isinstance(data, dict):
            raise self._bad_answer(_what_it_is(data))
        return _reply(ChatCompletion.construct(**data), self._bad_answer)

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
                              f"{plain_number(self._settings.timeout)} s{suffix} ({where})",
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


_REFUSING = ("unsupported", "not supported", "unrecognized", "unknown", "not permitted",
             "not allowed", "extra")


def _refuses(exc: openai.BadRequestError, name: str) -> bool:
    """Whether a 400 refuses the parameter `name` itself: its `param` field names it, or its
    message does, as one refused (`Unsupported parameter: 'max_tokens' ... Use
    'max_completion_tokens' instead.`, `Unrecognized request argument supplied:
    stream_options`)."""
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error")
    error: dict[str, Any] = inner if isinstance(inner, dict) else body
    if error.get("param") == name:
        return True
    message = str(error.get("message") or exc.message)
    if not re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message):
        return False
    lowered = message.lower()
    return any(word in lowered for word in _REFUSING) or TOKEN_NAMES.get(name, "\0") in message


class _Parts:
    """A streamed answer's pieces: the content, each tool call's id, name and arguments (by
    index), the usage the last chunk brings; `count`, the pieces so far (about a token
    each)."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.usage: Usage | None = None
        self.count = 0

    def add(self, chunk: Any) -> None:
        if getattr(chunk, "usage", None):
            self.usage = Usage(int(chunk.usage.prompt_tokens), int(chunk.usage.completion_tokens))
        for choice in chunk.choices or ():
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                self.content.append(str(delta.content))
                self.count += 1
            for call in delta.tool_calls or ():
                slot = self.calls.setdefault(int(call.index), {"id": "", "name": "",
                                                               "arguments": ""})
                slot["id"] = str(call.id or slot["id"])
                function = getattr(call, "function", None)
                if function is not None:
                    slot["name"] += str(function.name or "")
                    slot["arguments"] += str(function.arguments or "")
                    self.count += 1

    def reply(self) -> Reply:
        content = "".join(self.content) or None
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"])
                      for _, c in sorted(self.calls.items()) if c["name"])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return Reply(content, calls, self.usage or Usage(), message)


_BEARER = re.compile(r"(Bearer\s+)[^\s'\"]+", re.IGNORECASE)


def redact_key(text: str, key: str | None) -> str:
    """`text` without the API key: every `Bearer …` credential, and the key itself, as ***.
    A key shorter than 8 characters is hidden only where it stands alone: inside a longer
    word it is chance (a key `k` in "API key"), and hiding it there garbles the message."""
    text = _BEARER.sub(r"\1***", text)
    key = (key or "").strip()
    if not key:
        return text
    if len(key) >= 8:
        return text.replace(key, "***")
    return re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", "***", text)


@functools.cache
def _client_errors() -> tuple[type[Exception], ...]:
    """What the SDK's HTTP client raises for settings it cannot use: a URL or header it cannot
    send (an encoding error, IDNA or ASCII; a ValueError; the client library's own InvalidURL,
    its package looked up from the SDK's default client, so whichever one the SDK uses), and a
    timeout too large for the system's clock (OverflowError)."""
    library = sys.modules.get(openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
    invalid = getattr(library, "InvalidURL", None)
    found: tuple[type[Exception], ...] = (UnicodeError, ValueError, OverflowError)
    if isinstance(invalid, type) and issubclass(invalid, Exception):
        found = (*found, invalid)
    return found


@functools.cache
def _transport_errors() -> tuple[type[Exception], ...]:
    """What the SDK's HTTP client raises while a stream is read (a connection lost, a read
    timed out), which older SDKs do not wrap in their own errors."""
    library = sys.modules.get(openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
    found = getattr(library, "TransportError", None)
    return (found,) if isinstance(found, type) and issubclass(found, Exception) else ()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _why_retry(exc: BaseException | None, timeout: float) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return f"slow (no answer within {plain_number(timeout)} s)"
    if isinstance(exc, openai.RateLimitError):
        return "rate-limited (HTTP 429)"
    if isinstance(exc, openai.APIStatusError):
        return f"failing (HTTP {exc.status_code})"
    return "unreachable"


def _body_message(exc: openai.APIStatusError) -> str:
    """The error's own message, from its JSON body when there is one."""
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.message)[:300]


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
