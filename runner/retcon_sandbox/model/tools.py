"""The model's tools, each defined once: its schema, its argument checks and its handler.

A handler answers with text for the model, or with a `ToolOutcome` that ends the step. Which tools a
step offers is a tuple of names; a call to any other name is answered with an error the model
can correct.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from retcon_sandbox.backends.api import ToolFailure
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.paths import not_unicode
from retcon_sandbox.spec.owed import Owed
from retcon_sandbox.text import restore_undecodable
from retcon_sandbox.verify.stages import Verifier, describe

# --- how a step ends ------------------------------------------------------------------------


@dataclass(frozen=True)
class Committed:
    message: str


@dataclass(frozen=True)
class GaveUp:
    summary: str


@dataclass(frozen=True)
class NothingLeft:
    """Earlier commits already hold what this commit asked for."""

    reason: str


@dataclass(frozen=True)
class Assigned:
    """Remaining paths and the number of the commit each belongs to."""

    paths: dict[str, int]


@dataclass(frozen=True)
class Planned:
    """A plan's commits, in order: (message, paths, hints) each."""

    commits: tuple[tuple[str, tuple[str, ...], str], ...]


ToolOutcome = Committed | GaveUp | NothingLeft | Assigned | Planned


class EmptyCommit(ToolFailure):
    """create_commit with nothing changed; the agent counts these."""


def unicode_text(text: str, what: str) -> str:
    """`text`, or a ToolFailure when it cannot be written as UTF-8 (it holds a lone surrogate):
    a message or hints go into a commit or a spec exactly as given."""
    surrogate = not_unicode(text)
    if surrogate:
        raise ToolFailure(f"{what} holds a lone surrogate ({surrogate}), which UTF-8 text "
                          "cannot hold: write the character itself")
    return text


def named(path: str, allowed: set[str]) -> str:
    """The name the model means: a name it was shown with `\\xNN` for a byte that is not
    UTF-8 (as every name goes to it) stands for that name, when it is one of `allowed`."""
    if path in allowed:
        return path
    restored = restore_undecodable(path)
    return restored if restored in allowed else path


class Assignments:
    """What the model may assign in a remainder step, and what it did assign."""

    def __init__(self, paths: list[str], commits: int) -> None:
        self.allowed = set(paths)
        self.commits = commits
        self.chosen: dict[str, int] = {}

    def assign(self, path: str, commit: int) -> str:
        path = named(path, self.allowed)
        if path not in self.allowed:
            raise ToolFailure(f"{path} is not among the remaining paths")
        if not 0 <= commit <= self.commits:
            raise ToolFailure(f"commit must be 0 (none) or 1..{self.commits}")
        self.chosen[path] = commit
        left = len(self.allowed) - len(self.chosen)
        return f"{path} → commit {commit or 'none'} ({left} path(s) not assigned yet)"


class Proposals:
    """What the model may place in a plan step (the diff's files), and the commits it proposed.
    A file is placed once: naming one again, or one not in the diff, is an error to correct."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = list(paths)
        self.allowed = set(paths)
        self.commits: list[tuple[str, tuple[str, ...], str]] = []
        self.placed: dict[str, int] = {}

    def propose(self, message: str, paths: list[str], hints: str) -> str:
        message = unicode_text(message, "message").strip()
        hints = unicode_text(hints, "hints")
        if not message:
            raise ToolFailure("message is empty: give the commit's message")
        wanted = list(dict.fromkeys(named(p, self.allowed) for p in paths))
        unknown = [p for p in wanted if p not in self.allowed]
        if unknown:
            raise ToolFailure("not files of the diff (list them with read_diff): "
                              + ", ".join(unknown[:10]))
        again = [f"{p} (commit {self.placed[p]})" for p in wanted if p in self.placed]
        if again:
            raise ToolFailure("already placed, each file goes in exactly one commit: "
                              + ", ".join(again[:10]) + "; propose this commit without them")
        if not wanted:
            raise ToolFailure("paths is empty: list the files this commit takes")
        self.commits.append((message, tuple(wanted), hints.strip()))
        for p in wanted:
            self.placed[p] = len(self.commits)
        left = [p for p in self.paths if p not in self.placed]
        return (f"commit {len(self.commits)}: {len(wanted)} file(s); {len(left)} not placed yet"
                + (": " + ", ".join(left[:40]) + (" …" if len(left) > 40 else "") if left
                   else ". Call finish_plan."))


@dataclass
class StepContext:
    state: WorkState
    verifier: Verifier
    assignments: Assignments | None = None
    proposals: Proposals | None = None
    # what this commit still owes, were it to end without a commit (`spec.owed.still_owed`),
    # given the later commit the model says holds it
    owed: Callable[[int | None], Owed | None] | None = None
    refused: int = 0  # `nothing_to_extract` calls refused for what the commit owes


# --- the handlers ----------------------------------------------------------------------------

Handler = Callable[[StepContext, dict[str, Any]], "str | ToolOutcome"]


def _read_file(ctx: StepContext, a: dict[str, Any]) -> str:
    return ctx.state.read_file(a["path"], a.get("offset"), a.get("limit"))


def _write_file(ctx: StepContext, a: dict[str, Any]) -> str:
    return ctx.state.write_file(a["path"], a["content"])


def _delete_file(ctx: StepContext, a: dict[str, Any]) -> str:
    return ctx.state.delete_file(a["path"])


def _list_files(ctx: StepContext, a: dict[str, Any]) -> str:
    return ctx.state.list_files(a.get("path"))


def _read_diff(ctx: StepContext, a: dict[str, Any]) -> str:
    return ctx.state.read_diff(a.get("path"))


def _run_build(ctx: StepContext, a: dict[str, Any]) -> str:
    return describe(ctx.verifier.run(ctx.state, "build"), "Build")


def _run_tests(ctx: StepContext, a: dict[str, Any]) -> str:
    return describe(ctx.verifier.run(ctx.state, "test"), "Tests")


def _create_commit(ctx: StepContext, a: dict[str, Any]) -> ToolOutcome:
    if not ctx.state.changes() or ctx.state.tree() == ctx.state.base_tree:
        raise EmptyCommit("nothing to commit: the working state has no change since the last "
                          "commit. Make the change first; if earlier commits already hold "
                          "everything this commit asks for, call nothing_to_extract; if you "
                          "cannot make progress, call report_stuck.")
    return Committed(unicode_text(str(a["message"]), "message").strip())


def _report_stuck(ctx: StepContext, a: dict[str, Any]) -> ToolOutcome:
    return GaveUp(str(a["summary"]).strip() or "(no summary)")


def _nothing_to_extract(ctx: StepContext, a: dict[str, Any]) -> ToolOutcome:
    if ctx.state.changes() and ctx.state.tree() != ctx.state.base_tree:
        raise ToolFailure("the working state has changes: call create_commit to commit them, "
                          "or undo them first if this commit really has nothing to take")
    held_by = a.get("held_by")
    owed = ctx.owed(held_by) if ctx.owed else None
    if owed is not None:
        ctx.refused += 1
        if ctx.refused > 1:  # told once what is owed: the commit would vanish, so it stops
            return GaveUp(owed.summary())
        raise ToolFailure(owed.for_model())
    reason = str(a["reason"]).strip() or "(no reason given)"
    if held_by is not None and ctx.owed is not None and ctx.owed(None) is not None:
        reason += f"\n(What is left of its files is for commit #{held_by}, which names them.)"
    return NothingLeft(reason)


def _assign_path(ctx: StepContext, a: dict[str, Any]) -> str:
    if ctx.assignments is None:
        raise ToolFailure("assign_path is only offered in the remainder step")
    return ctx.assignments.assign(a["path"], a["commit"])


def _finish_assignment(ctx: StepContext, a: dict[str, Any]) -> ToolOutcome:
    if ctx.assignments is None:
        raise ToolFailure("finish_assignment is only offered in the remainder step")
    return Assigned(dict(ctx.assignments.chosen))


def _propose_commit(ctx: StepContext, a: dict[str, Any]) -> str:
    if ctx.proposals is None:
        raise ToolFailure("propose_commit is only offered in the plan step")
    return ctx.proposals.propose(a["message"], a["paths"], a.get("hints") or "")


def _finish_plan(ctx: StepContext, a: dict[str, Any]) -> ToolOutcome:
    if ctx.proposals is None:
        raise ToolFailure("finish_plan is only offered in the plan step")
    return Planned(tuple(ctx.proposals.commits))


# --- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "string" | "integer" | "array" (of strings)
    description: str
    required: bool = True


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]
    handler: Handler


PATH = Param("path", "string", "Path relative to the repository root, e.g. src/app.py")

TOOLS: tuple[Tool, ...] = (
    Tool("read_file", "Read a file of the working state, with line numbers, a page at a time. "
         "Page long files with offset (first line, 1-based) and limit (number of lines); the "
         "answer says how to read the rest.",
         (PATH, Param("offset", "integer", "First line to show (1-based)", False),
          Param("limit", "integer", "How many lines to show", False)), _read_file),
    Tool("write_file", "Write a whole file (created if missing). Answers with +N -M, "
         "`no changes` when the content is identical, and the diff for a large rewrite.",
         (PATH, Param("content", "string", "The complete new content of the file")),
         _write_file),
    Tool("delete_file", "Delete a file.", (PATH,), _delete_file),
    Tool("list_files", "List the files of the working state, optionally under a directory.",
         (Param("path", "string", "A directory to list", False),), _list_files),
    Tool("read_diff", "The diff from the current working state to the source branch: what is "
         "still left to reconstruct. Optionally for one path.",
         (Param("path", "string", "Limit the diff to this path", False),), _read_diff),
    Tool("run_build", "Run the build command in the sandbox; answers PASS or FAIL with output.",
         (), _run_build),
    Tool("run_tests", "Run the test command in the sandbox; answers PASS or FAIL with output.",
         (), _run_tests),
    Tool("create_commit", "Finish this step: commit every change made through write_file and "
         "delete_file.", (Param("message", "string", "What this change does, in one or two "
                                "sentences"),), _create_commit),
    Tool("report_stuck", "Finish this step without a commit because you cannot make progress; "
         "explain what a human needs to decide or change.",
         (Param("summary", "string", "What is blocking and what would unblock it"),),
         _report_stuck),
    Tool("nothing_to_extract", "Finish this step without a commit because earlier commits "
         "already hold everything this commit asks for (read_diff shows nothing of it left), "
         "or a later commit holds what is left of it (held_by).",
         (Param("reason", "string", "Why nothing is left for this commit"),
          Param("held_by", "integer", "When files this commit names still differ: the number "
                "of the later commit that holds all that is left of them (it must name them "
                "too)", False)),
         _nothing_to_extract),
    Tool("assign_path", "Say which commit a remaining changed path belongs to.",
         (PATH, Param("commit", "integer", "The commit's number, or 0 if it belongs to none")),
         _assign_path),
    Tool("finish_assignment", "Finish assigning; paths not assigned go into a final commit.",
         (), _finish_assignment),
    Tool("propose_commit", "Propose the next commit of the plan, in order: its message and the "
         "files it takes whole from the source branch. Each file of the diff goes in exactly "
         "one commit.",
         (Param("message", "string", "The commit message, in the repository's style"),
          Param("paths", "array", "The files this commit takes, as read_diff names them"),
          Param("hints", "string", "What belongs in this commit, for whoever extracts it",
                False)), _propose_commit),
    Tool("finish_plan", "Finish the plan; files not placed go back to the draft's commits.",
         (), _finish_plan),
)

BY_NAME = {tool.name: tool for tool in TOOLS}
# What each kind of step offers the model.
WORK_TOOLS = ("read_file", "write_file", "delete_file", "list_files", "read_diff", "run_build",
              "run_tests", "create_commit", "report_stuck")
EXTRACT_TOOLS = (*WORK_TOOLS, "nothing_to_extract")
ASSIGN_TOOLS = ("read_diff", "read_file", "list_files", "assign_path", "finish_assignment")
PLAN_TOOLS = ("read_diff", "read_file", "list_files", "propose_commit", "finish_plan")


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
                    "properties": {p.name: _property(p) for p in tool.params},
                    "required": [p.name for p in tool.params if p.required],
                    "additionalProperties": False,
                },
            },
        }
        for tool in (BY_NAME[name] for name in names)
    ]


def _property(param: Param) -> dict[str, Any]:
    if param.kind == "array":
        return {"type": "array", "items": {"type": "string"}, "description": param.description}
    return {"type": param.kind, "description": param.description}


def parse_call(name: str, raw: str, offered: tuple[str, ...]) -> tuple[Tool, dict[str, Any]]:
    """Check a tool call's name and arguments; raise ArgumentError with a correctable message."""
    tool = BY_NAME.get(name) if name in offered else None
    if tool is None:
        raise ArgumentError(f"unknown tool {name[:80]!r}; the tools are: {', '.join(offered)}")
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
        if param.kind == "array" and (not isinstance(value, list) or
                                      not all(isinstance(v, str) for v in value)):
            raise ArgumentError(f"{name}: {param.name!r} must be an array of strings")
    unknown = set(args) - {p.name for p in tool.params}
    if unknown:
        raise ArgumentError(f"{name} does not take {', '.join(sorted(unknown))[:200]}")
    return tool, args


def call(ctx: StepContext, tool: Tool, args: dict[str, Any]) -> str | ToolOutcome:
    return tool.handler(ctx, args)
