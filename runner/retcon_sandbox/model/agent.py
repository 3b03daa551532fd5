"""One LLM step: a bounded conversation in which the model uses the tools and ends the step with
an outcome: a commit, "stuck", "nothing to extract", or (in the remainder step) assignments."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retcon_sandbox import progress
from retcon_sandbox.backends.api import ToolFailure
from retcon_sandbox.model.llm import ChatModel, Reply, Usage
from retcon_sandbox.model.tools import (
    WORK_TOOLS,
    ArgumentError,
    EmptyCommit,
    GaveUp,
    StepContext,
    ToolOutcome,
    openai_schema,
    parse_call,
)
from retcon_sandbox.report import Reporter
from retcon_sandbox.resources import prompt
from retcon_sandbox.spec.statedir import open_append


class Transcript:
    """Every exchange with the model, one JSON object per line, in the run's state directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def write(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            self._fd = open_append(self.path)
        line = json.dumps({"time": round(time.time(), 3), **record}, ensure_ascii=False) + "\n"
        os.write(self._fd, line.encode("utf-8", "surrogateescape"))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class StepLimits:
    max_turns: int = 40
    empty_commits: int = 3


class Agent:
    def __init__(self, model: ChatModel, transcript: Transcript, limits: StepLimits,
                 report: Reporter | None = None) -> None:
        """`report`: where each model request's phase events go (progress.phase)."""
        self.model = model
        self.transcript = transcript
        self.limits = limits
        self.report = report

    def run(self, ctx: StepContext, task: str, label: str,
            offered: tuple[str, ...] = WORK_TOOLS, system: str = "system",
            number: int | None = None) -> tuple[ToolOutcome, Usage]:
        """One step; `number`: the commit it works on, for the progress lines."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompt(system)},
            {"role": "user", "content": task},
        ]
        usage = Usage()
        empty_commits = 0
        logged = 0
        schema = openai_schema(offered)
        for turn in range(1, self.limits.max_turns + 1):
            sent = len(messages)
            asked = time.monotonic()
            what = f"{f'#{number} ' if number is not None else ''}model ({label}, turn {turn})"
            with progress.phase(self.report, "model", number, what):
                reply = self.model.complete(messages, schema)
            usage = usage + reply.usage
            self.transcript.write({"step": label, "turn": turn, "model": self.model.name,
                                   "sent": messages[logged:sent], "reply": reply.message,
                                   "usage": {"prompt_tokens": reply.usage.prompt_tokens,
                                             "completion_tokens": reply.usage.completion_tokens},
                                   "seconds": round(time.monotonic() - asked, 3)})
            messages.append(reply.message)
            logged = len(messages)
            outcome, results, empty = self._act(ctx, reply, offered)
            empty_commits += empty
            messages.extend(results)
            if outcome is not None:
                return outcome, usage
            if empty_commits >= self.limits.empty_commits:
                return GaveUp(f"No progress: {empty_commits} attempts to commit changed nothing "
                              "(the tree stayed the same)."), usage
        return GaveUp(f"The model did not finish the step within {self.limits.max_turns} turns."
                      ), usage

    @staticmethod
    def _act(ctx: StepContext, reply: Reply, offered: tuple[str, ...]
             ) -> tuple[ToolOutcome | None, list[dict[str, Any]], int]:
        if not reply.tool_calls:
            return None, [{"role": "user", "content": prompt("nudge")}], 0
        results: list[dict[str, Any]] = []
        empty = 0
        for call in reply.tool_calls:
            try:
                tool, args = parse_call(call.name, call.arguments, offered)
                answer = tool.handler(ctx, args)
                if not isinstance(answer, str):
                    return answer, results, empty
                text = answer
            except EmptyCommit as exc:
                empty += 1
                text = f"error: {exc}"
            except (ArgumentError, ToolFailure) as exc:
                text = f"error: {exc}"
            results.append({"role": "tool", "tool_call_id": call.id, "content": text})
        return None, results, empty
