"""The base check: the base commit's build and tests, run only when the first commit on the
base fails its own. Then they tell a dependency the sandbox lacks (a configuration error, exit
1, before the model is asked to fix what no commit can) from a failure the first commit has to
fix (a warning, and the fix loop goes on). When the first commit passes, the base's verdict
would explain nothing and cost a whole build and test suite: it is not run. Run beside the first
commit's extraction instead, it would cost that suite's CPU on every run, and sit on the
critical path whenever the extraction is quicker (a `paths` commit, a fast model).

The verdict goes through the verification cache like any tree's, so a resume, or a redo, finds
it there: the check costs a lookup, or nothing.
"""

from __future__ import annotations

import contextlib

from retcon_sandbox.backends.api import Sandbox
from retcon_sandbox.errors import ConfigError
from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.verify import missing


def explain_failure(ctx: Run) -> None:
    """After a failed verification: when the failing tree is the first commit on the base (the
    branch's tip's parent is the merge-base), and this run has not checked the base yet, build
    and test the base (cached like any tree). A missing module, crate or package raises a
    ConfigError naming it and the setup that installs it; any other failure is a warning."""
    if not ctx.options.base_check or ctx.base_checked or not ctx.verifier.runs_anything:
        return
    if ctx.repo.parent_of(ctx.tip()) != ctx.base:
        return
    ctx.base_checked = True
    tree = ctx.repo.tree_of(ctx.base)
    with contextlib.ExitStack() as stack:
        opened: list[Sandbox] = []

        def box() -> Sandbox:
            if not opened:
                place = (ctx.base, 0)
                opened.append(stack.enter_context(ctx.envs.sandbox("base-check", tree,
                                                                   place)).box)
            return opened[0]

        outcome = ctx.verifier.baseline(tree, box)
    failed = next((s.which for s in outcome.stages if not s.passed), "test")
    verdict = missing.judge(outcome.failure, ctx.settings.setup, ctx.repo.ls_tree(tree),
                            "build" if failed == "build" else "tests")
    if isinstance(verdict, ConfigError):
        raise verdict
    if verdict is not None:
        ctx.report.emit("warning", message=verdict)
