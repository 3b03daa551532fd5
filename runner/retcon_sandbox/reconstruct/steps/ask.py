"""Asking the model for one step, and the resolution note it is shown after a `stuck`."""

from __future__ import annotations

from collections.abc import Callable

from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.model.tools import WORK_TOOLS, Assigned, GaveUp, StepContext, ToolOutcome
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.resources import prompt
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.owed import Owed


def ask_model(ctx: Run, commit: CommitSpec, state: WorkState, task: str, label: str,
              offered: tuple[str, ...] = WORK_TOOLS,
              owed: Callable[[int | None], Owed | None] | None = None,
              tokens: str | None = None
              ) -> ToolOutcome:
    """`tokens`: the summary's key the usage is counted under (the commit's number unless
    said; a speculation counts its own, see steps/speculate.py)."""
    assert ctx.agent is not None
    tool_ctx = StepContext(state, ctx.verifier, owed=owed)
    outcome, usage = ctx.agent.run(tool_ctx, task, f"commit-{commit.number}/{label}", offered,
                                   number=commit.number)
    ctx.add_tokens(tokens or str(commit.number), usage.total)
    if isinstance(outcome, Assigned):  # not offered in a work step
        outcome = GaveUp("The model ended a work step without a commit.")
    if isinstance(outcome, GaveUp):
        ctx.report.emit("llm_stuck", number=commit.number, summary=outcome.summary)
    return outcome


def resolution(stuck: str | None, note: str | None) -> str:
    if not note:
        return ""
    return prompt("resolution", stuck=stuck or "(no summary)", note=note)
