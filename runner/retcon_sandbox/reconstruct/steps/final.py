"""`[sandbox] test_final`: the finished branch's tree (the one that must equal the source, after
the squash if there is one) is built and tested with the final test command, when the spec gives
one lighter `test` for each commit and a full `test_final` for the end.

The check goes through the verification cache like any other: its key names the test command,
so a result under `test` never stands for one under `test_final`, nor the reverse. A failure is
reported on the final tree, and the run ends with exit 3 (the branch stays as it is: every
commit on it passed `test`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from retcon_sandbox.reconstruct.context import Run
from retcon_sandbox.verify.cache import Outcome
from retcon_sandbox.verify.pool import Item, Pool


@dataclass(frozen=True)
class FinalCheck:
    command: str | None
    tree: str
    outcome: Outcome

    @property
    def verdict(self) -> str:
        failed = next((s for s in self.outcome.stages if not s.passed), None)
        return failed.verdict if failed else "PASS"


def final_check(ctx: Run, tip: str) -> FinalCheck | None:
    """Build and test the tip's tree with the final commands (your cache first); None when the
    spec has no `test_final`."""
    verifier = ctx.final
    if verifier is None or not verifier.runs_anything:
        return None
    tree = ctx.repo.tree_of(tip)
    command = verifier.commands.planned("test")
    ctx.report.emit("final_verify", tree=tree, command=command)
    pool = Pool(ctx.repo, ctx.envs, verifier, 1, report=ctx.report)
    outcomes = pool.run([Item(tree, "final", name="final tree")], lambda item, outcome: None)
    check = FinalCheck(command, tree, outcomes[tree])
    ctx.report.emit("final_tree", tree=tree, command=command, verdict=check.verdict,
                    passed=check.outcome.passed, cached=check.outcome.cached,
                    seconds=round(check.outcome.seconds, 3),
                    tail=None if check.outcome.passed else check.outcome.tail)
    return check


def tests_summary(ctx: Run, check: FinalCheck | None) -> dict[str, Any] | None:
    """Which trees got which test command, for the summary; None when no tests ran."""
    command = ctx.verifier.commands.planned("test")
    if command is None and check is None:
        return None
    final = None if check is None else {
        "command": check.command, "tree": check.tree, "verdict": check.verdict,
        "passed": check.outcome.passed, "cached": check.outcome.cached}
    return {"each_commit": {"command": command, "trees": len(ctx.verifier.tested)},
            "final": final}
