"""One LLM step: a bounded conversation in which the model uses the tools and ends the step by
committing or by reporting that it is stuck."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, TextIO

from runner.llm import ChatModel, Reply, Usage
from runner.sandbox_api import ToolFailure
from runner.tools import WORK_TOOLS, ArgumentError, openai_schema, parse_call
from runner.workspace import WorkState, describe

PROMPTS = Path(__file__).resolve().parent / "prompts"


def prompt(name: str, **values: object) -> str:
    text = (PROMPTS / f"{name}.md").read_text(encoding="utf-8")
    return Template(text).safe_substitute({k: str(v) for k, v in values.items()})


@dataclass(frozen=True)
class Committed:
    message: str


@dataclass(frozen=True)
class GaveUp:
    summary: str


@dataclass(frozen=True)
class Assigned:
    """Remaining paths and the number of the commit each belongs to."""

    paths: dict[str, int]


Outcome = Committed | GaveUp | Assigned


class Assignments:
    """What the model may assign in a remainder step, and what it did assign."""

    def __init__(self, paths: list[str], commits: int) -> None:
        self.allowed = set(paths)
        self.commits = commits
        self.chosen: dict[str, int] = {}

    def assign(self, path: str, commit: int) -> str:
        if path not in self.allowed:
            raise ToolFailure(f"{path} is not among the remaining paths")
        if not 0 <= commit <= self.commits:
            raise ToolFailure(f"commit must be 0 (none) or 1..{self.commits}")
        self.chosen[path] = commit
        left = len(self.allowed) - len(self.chosen)
        return f"{path} → commit {commit or 'none'} ({left} path(s) not assigned yet)"


class Transcript:
    """Every exchange with the model, one JSON object per line, beside the spec."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: TextIO | None = None

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            self._handle = self.path.open("a", encoding="utf-8")
        self._handle.write(json.dumps({"time": round(time.time(), 3), **record},
                                      ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle:
            self._handle.close()
            self._handle = None


@dataclass(frozen=True)
class StepLimits:
    max_turns: int = 40
    empty_commits: int = 3


class Agent:
    def __init__(self, model: ChatModel, transcript: Transcript, limits: StepLimits) -> None:
        self.model = model
        self.transcript = transcript
        self.limits = limits

    def run(self, state: WorkState, task: str, label: str, offered: tuple[str, ...] = WORK_TOOLS,
            assignments: Assignments | None = None) -> tuple[Outcome, Usage]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompt("system")},
            {"role": "user", "content": task},
        ]
        usage = Usage()
        empty_commits = 0
        logged = 0
        schema = openai_schema(offered)
        for turn in range(1, self.limits.max_turns + 1):
            sent = len(messages)
            reply = self.model.complete(messages, schema)
            usage = usage + reply.usage
            self.transcript.write({"step": label, "turn": turn, "model": self.model.name,
                                   "sent": messages[logged:sent], "reply": reply.message,
                                   "usage": {"prompt_tokens": reply.usage.prompt_tokens,
                                             "completion_tokens": reply.usage.completion_tokens}})
            messages.append(reply.message)
            logged = len(messages)
            outcome, results, empty = self._act(state, reply, offered, assignments)
            empty_commits += empty
            messages.extend(results)
            if outcome is not None:
                return outcome, usage
            if empty_commits >= self.limits.empty_commits:
                return GaveUp(f"No progress: {empty_commits} attempts to commit changed nothing "
                              "(the tree stayed the same)."), usage
        return GaveUp(f"The model did not finish the step within {self.limits.max_turns} turns."
                      ), usage

    def _act(self, state: WorkState, reply: Reply, offered: tuple[str, ...],
             assignments: Assignments | None) -> tuple[Outcome | None, list[dict[str, Any]], int]:
        if not reply.tool_calls:
            return None, [{"role": "user", "content": prompt("nudge")}], 0
        results: list[dict[str, Any]] = []
        empty = 0
        for call in reply.tool_calls:
            try:
                tool, args = parse_call(call.name, call.arguments, offered)
                if assignments is not None and tool.name == "finish_assignment":
                    return Assigned(dict(assignments.chosen)), results, empty
                if assignments is not None and tool.name == "assign_path":
                    text = assignments.assign(args["path"], args["commit"])
                    results.append({"role": "tool", "tool_call_id": call.id, "content": text})
                    continue
                if tool.name == "report_stuck":
                    return GaveUp(str(args["summary"]).strip() or "(no summary)"), results, empty
                if tool.name == "create_commit":
                    if state.tree() == state.base_tree:
                        empty += 1
                        raise ToolFailure("nothing to commit: the working state has no change "
                                          "since the last commit. Make the change first, or "
                                          "call report_stuck.")
                    return Committed(str(args["message"]).strip()), results, empty
                text = self._dispatch(state, tool.name, args)
            except (ArgumentError, ToolFailure) as exc:
                text = f"error: {exc}"
            results.append({"role": "tool", "tool_call_id": call.id, "content": text})
        return None, results, empty

    @staticmethod
    def _dispatch(state: WorkState, name: str, args: dict[str, Any]) -> str:
        if name == "read_file":
            return state.read_file(args["path"], args.get("offset"), args.get("limit"))
        if name == "write_file":
            return state.write_file(args["path"], args["content"])
        if name == "delete_file":
            return state.delete_file(args["path"])
        if name == "list_files":
            return state.list_files(args.get("path"))
        if name == "read_diff":
            return state.read_diff(args.get("path"))
        if name == "run_build":
            return describe(state.run("build"), "Build")
        return describe(state.run("test"), "Tests")
