"""The LLM's tools, defined once: the schema sent to the model and the argument checks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "string" | "integer"
    description: str
    required: bool = True


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...] = ()


PATH = Param("path", "string", "Path relative to the repository root, e.g. src/app.py")

TOOLS: tuple[Tool, ...] = (
    Tool("read_file", "Read a file of the working state, with line numbers. Page long files "
         "with offset (first line, 1-based) and limit (number of lines).",
         (PATH, Param("offset", "integer", "First line to show (1-based)", False),
          Param("limit", "integer", "How many lines to show", False))),
    Tool("write_file", "Write a whole file (created if missing). Answers with +N -M, "
         "`no changes` when the content is identical, and the diff for a large rewrite.",
         (PATH, Param("content", "string", "The complete new content of the file"))),
    Tool("delete_file", "Delete a file.", (PATH,)),
    Tool("list_files", "List the files of the working state, optionally under a directory.",
         (Param("path", "string", "A directory to list", False),)),
    Tool("read_diff", "The diff from the current working state to the source branch: what is "
         "still left to reconstruct. Optionally for one path.",
         (Param("path", "string", "Limit the diff to this path", False),)),
    Tool("run_build", "Run the build command in the sandbox; answers PASS or FAIL with output."),
    Tool("run_tests", "Run the test command in the sandbox; answers PASS or FAIL with output."),
    Tool("create_commit", "Finish this step: commit every change made through write_file and "
         "delete_file.", (Param("message", "string", "What this change does, in one or two "
                                "sentences"),)),
    Tool("report_stuck", "Finish this step without a commit because you cannot make progress; "
         "explain what a human needs to decide or change.",
         (Param("summary", "string", "What is blocking and what would unblock it"),)),
    Tool("assign_path", "Say which commit a remaining changed path belongs to.",
         (PATH, Param("commit", "integer", "The commit's number, or 0 if it belongs to none"))),
    Tool("finish_assignment", "Finish assigning; paths not assigned go into a final commit."),
)

BY_NAME = {tool.name: tool for tool in TOOLS}
# What each kind of step offers the model.
WORK_TOOLS = ("read_file", "write_file", "delete_file", "list_files", "read_diff", "run_build",
              "run_tests", "create_commit", "report_stuck")
ASSIGN_TOOLS = ("read_diff", "read_file", "list_files", "assign_path", "finish_assignment")


class ArgumentError(Exception):
    """A tool call the model must correct; the message tells it how."""


def openai_schema(names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: {"type": p.kind, "description": p.description}
                                   for p in tool.params},
                    "required": [p.name for p in tool.params if p.required],
                    "additionalProperties": False,
                },
            },
        }
        for tool in (BY_NAME[name] for name in names)
    ]


def parse_call(name: str, raw: str, offered: tuple[str, ...]) -> tuple[Tool, dict[str, Any]]:
    """Check a tool call's name and arguments; raise ArgumentError with a correctable message."""
    tool = BY_NAME.get(name) if name in offered else None
    if tool is None:
        raise ArgumentError(f"unknown tool {name!r}; the tools are: {', '.join(offered)}")
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise ArgumentError(f"the arguments of {name} are not valid JSON ({exc}); send a JSON "
                            "object") from None
    if not isinstance(args, dict):
        raise ArgumentError(f"the arguments of {name} must be a JSON object")
    for param in tool.params:
        value = args.get(param.name)
        if value is None:
            if param.required:
                raise ArgumentError(f"{name} needs the argument {param.name!r} "
                                    f"({param.description})")
            continue
        if param.kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ArgumentError(f"{name}: {param.name!r} must be an integer")
        if param.kind == "string" and not isinstance(value, str):
            raise ArgumentError(f"{name}: {param.name!r} must be a string")
    unknown = set(args) - {p.name for p in tool.params}
    if unknown:
        raise ArgumentError(f"{name} does not take {', '.join(sorted(unknown))}")
    return tool, args
