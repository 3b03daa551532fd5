"""A real HTTP server speaking OpenAI's Chat Completions API, with scripted replies.

Each POST to /v1/chat/completions takes the next item of the script: a `Fault(status)` answers
with that HTTP error; a list of `call(...)` answers with those tool calls; a string answers with
plain content. Every request body is recorded for assertions.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Fault:
    status: int


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # raw, so malformed JSON can be scripted


def call(name: str, raw: str | None = None, **args: Any) -> Call:
    return Call(name, raw if raw is not None else json.dumps(args))


Step = Fault | list[Call] | str


class FakeOpenAI:
    def __init__(self, script: list[Step]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._calls = 0
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

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

    def _next(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            if not self.script:
                return 500, {"error": {"message": "script exhausted", "type": "test"}}
            step = self.script.pop(0)
            self._calls += 1
            n = self._calls
        if isinstance(step, Fault):
            return step.status, {"error": {"message": f"scripted fault {step.status}",
                                           "type": "test", "code": None}}
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
                    status, payload = 404, {"error": {"message": "not found"}}
                else:
                    status, payload = fake._next(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
