"""A real HTTP server speaking OpenAI's Chat Completions API, with scripted replies.

Each POST to /v1/chat/completions takes the next item of the script: a `Fault(status)` answers
with that HTTP error; a list of `call(...)` answers with those tool calls; a string answers with
plain content; `Raw(...)` answers with any body (an HTML page, text that is not JSON); `Hang()`
answers nothing until the server shuts down. A request for a model not in `models` (when given)
is answered 404, as OpenAI does. Every request body is recorded for assertions. The tool's
preflight request is answered by `preflight` (plain "OK" by default) without taking an item of
the script. `refused_url()` is an endpoint where nothing listens.

Instead of a script, `respond` may answer each request from its body (a model whose answer
depends on what it is asked, not on the order of the requests: what a pipelined run needs to
be compared with a serial one). `latency` delays every answer by that many seconds.

`streams=True`: a request that asks to stream (`stream: true`) is answered with server-sent
events, as OpenAI streams: the content and each tool call's arguments in pieces of a few
characters, `chunk_delay` seconds apart, then the usage when `stream_options.include_usage`
asks for it, then `[DONE]`. Otherwise the answer is one JSON body whatever the request asks
(as a server that does not stream).

`refuse` names request parameters the server refuses with OpenAI's own 400 (`Unsupported
parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens'
instead.`), as its reasoning models refuse `max_tokens`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Fault:
    status: int
    message: str = ""
    headers: tuple[tuple[str, str], ...] = ()  # e.g. (("Retry-After", "1"),)


@dataclass(frozen=True)
class Raw:
    """Any answer at all: a status, a body and its content type."""

    body: str
    status: int = 200
    content_type: str = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Hang:
    """No answer, until the server shuts down."""


HTML = Raw("<!DOCTYPE html><html><head><title>Welcome</title></head>"
           "<body><h1>It works!</h1></body></html>\n")
NOT_JSON = Raw("OK\n", content_type="text/plain")
BROKEN_JSON = Raw('{"id": "chatcmpl-1", "choices": [', content_type="application/json")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # raw, so malformed JSON can be scripted


def call(name: str, raw: str | None = None, **args: Any) -> Call:
    return Call(name, raw if raw is not None else json.dumps(args))


Step = Fault | Raw | Hang | list[Call] | str
Answer = tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], tuple[tuple[str, str], ...]]


def refused_url() -> str:
    """An endpoint on a port nothing listens on (bound, then closed, so no one else has it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class FakeOpenAI:
    def __init__(self, script: list[Step], preflight: Step = "OK",
                 models: tuple[str, ...] | None = None, tools: bool = True,
                 respond: Callable[[dict[str, Any]], Step] | None = None,
                 latency: float = 0.0, refuse: tuple[str, ...] = (), streams: bool = False,
                 chunk_delay: float = 0.0) -> None:
        """`tools=False`: a server without tool calling, which answers 400 to any request that
        offers tools (as Ollama does for such a model)."""
        self.script = list(script)
        self.respond = respond
        self.latency = latency
        self.tools = tools
        self.preflight = preflight
        self.models = models
        self.refuse = refuse
        self.streams = streams
        self.chunk_delay = chunk_delay
        self.refused: list[str] = []  # the parameter each refused request sent
        self._closing = threading.Event()
        self.preflights = 0
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._calls = 0
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)  # polls shutdown() every 20 ms, not 500

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def remaining(self) -> int:
        return len(self.script)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()

    def tool_results(self) -> list[str]:
        """Every tool result the client sent back, in order (deduplicated across turns)."""
        seen: dict[str, str] = {}
        for body in self.requests:
            for message in body["messages"]:
                if message.get("role") == "tool":
                    seen[message["tool_call_id"]] = message["content"]
        return list(seen.values())

    def _next(self, body: dict[str, Any]) -> Step | Answer:
        with self._lock:
            self._calls += 1
            n = self._calls
            if self.models is not None and body.get("model") not in self.models:
                return 404, {"error": {"message": f"The model `{body.get('model')}` does not "
                                                  "exist or you do not have access to it.",
                                       "type": "invalid_request_error",
                                       "code": "model_not_found"}}
            refused = next((name for name in self.refuse if name in body), None)
            if refused is not None:
                self.refused.append(refused)
                return 400, _unsupported(refused)
            if body.get("tools") and not self.tools:
                return 400, {"error": {"message": f"registry.ollama.ai/library/"
                                                  f"{body.get('model')} does not support tools",
                                       "type": "api_error", "param": None, "code": None}}
            if _is_preflight(body):
                self.preflights += 1
                step = self.preflight
            else:
                self.requests.append(body)
                if self.respond is not None:
                    step = self.respond(body)
                elif not self.script:
                    return 500, {"error": {"message": "script exhausted", "type": "test"}}, \
                        (("retry-after-ms", "20"),)  # retried as often, without the backoff
                else:
                    step = self.script.pop(0)
        if isinstance(step, Raw | Hang):
            return step
        if isinstance(step, Fault):
            return step.status, {"error": {"message": step.message or
                                           f"scripted fault {step.status}",
                                           "type": "test", "code": None}}, step.headers
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(step, str):
            message["content"] = step
        else:
            message["tool_calls"] = [
                {"id": f"call_{n}_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(step)
            ]
        return 200, {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if not isinstance(step, str) else "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    answer: Step | Answer = (404, {"error": {"message": "not found"}})
                else:
                    answer = fake._next(body)
                    if fake.latency and not _is_preflight(body):
                        time.sleep(fake.latency)
                if isinstance(answer, Hang):
                    fake._closing.wait()
                    return
                headers: tuple[tuple[str, str], ...] = ()
                if isinstance(answer, Raw):
                    status, content_type = answer.status, answer.content_type
                    data = answer.body.encode()
                else:
                    assert isinstance(answer, tuple)
                    status, content_type = answer[0], "application/json"
                    data = json.dumps(answer[1]).encode()
                    headers = answer[2] if len(answer) == 3 else ()
                if fake.streams and body.get("stream") and status == 200 \
                        and isinstance(answer, tuple):
                    self._stream(answer[1], body)
                    return
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, completion: dict[str, Any], body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in chunks(completion, body):
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    if fake.chunk_delay:
                        time.sleep(fake.chunk_delay)
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def chunks(completion: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as OpenAI streams it: `chat.completion.chunk`s of a few characters."""
    message = completion["choices"][0]["message"]
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": 0,
            "model": completion["model"]}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    found = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    found += [chunk({"content": text[i:i + 3]}) for i in range(0, len(text), 3)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        found.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                            "function": {"name": call["function"]["name"],
                                                         "arguments": ""}}]}))
        arguments = call["function"]["arguments"]
        found += [chunk({"tool_calls": [{"index": index, "function": {
            "arguments": arguments[i:i + 8]}}]}) for i in range(0, len(arguments), 8)]
    found.append(chunk({}, completion["choices"][0]["finish_reason"]))
    if (body.get("stream_options") or {}).get("include_usage"):
        found.append({**base, "choices": [], "usage": completion["usage"]})
    return found


INSTEAD = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}


def _unsupported(name: str) -> dict[str, Any]:
    """OpenAI's refusal of a parameter, word for word."""
    other = INSTEAD.get(name)
    return {"error": {"message": f"Unsupported parameter: '{name}' is not supported with this "
                                 "model." + (f" Use '{other}' instead." if other else ""),
                      "type": "invalid_request_error", "param": name,
                      "code": "unsupported_parameter"}}


def _is_preflight(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return len(messages) == 1 and "retcon-sandbox preflight" in str(messages[0].get("content"))
