"""Pipelined reconstruction: while commit k builds and tests (in a thread of its own that does
sandbox I/O only, `verify.stages.overlapped`), commit k+1 is begun here, ahead, on k's tree.
Pipeline.WARM (the default) opens its sandbox on that tree, so k+1 starts on a ready container;
Pipeline.FULL (`--pipeline`) also has the model extract it while that container starts. A
speculation writes nothing to the spec or the branch (git objects only), and its events are
held back.

When k is done, `opened` keeps the speculation if it is exactly what a serial run of k+1 would
start from (`keep`: k+1's history is empty and the branch's tip has the tree it began on, so k
needed no fix); then k+1 goes on from it here, in the order a serial run writes, so the spec's
history, the commits and the trees are the serial run's. Otherwise it is discarded (its sandbox
removed; its tokens stay counted, as "speculative, discarded") and k+1 runs as it would
serially. Only this thread touches git and the spec.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from retcon_sandbox import threads
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.errors import RetconError
from retcon_sandbox.model.tools import ToolOutcome
from retcon_sandbox.pipeline import Pipeline
from retcon_sandbox.reconstruct.context import Buffered, Run, Speculation
from retcon_sandbox.reconstruct.steps.extract import ask_extraction
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.history import Entry, Extract

DISCARDED = "speculative, discarded"  # the summary's token count of discarded speculations


def keep(speculated: int, base_tree: str, number: int, history: Sequence[Entry],
         tip_tree: str) -> bool:
    """Whether a speculation of commit `speculated`, begun on `base_tree`, is what a serial run
    of commit `number` does now: the same commit, nothing recorded for it yet, and the tree it
    began on is the branch tip's (the previous commit needed no fix since)."""
    return speculated == number and not history and base_tree == tip_tree


def worth(pipeline: Pipeline, number: int, total: int, following: Sequence[Entry] | None) -> bool:
    """Whether to begin commit `number + 1` while `number` builds and tests: when pipelining is
    on (WARM or FULL) and the next commit exists with nothing recorded yet (`following`: its
    history)."""
    return pipeline != Pipeline.OFF and number < total and following is not None and not following


def ahead(ctx: Run, number: int) -> Callable[[], None] | None:
    """The work for this thread while commit `number` builds and tests, if any."""
    total = len(ctx.spec.commits)
    following = ctx.commit_spec(number + 1) if number < total else None
    if following is None or not worth(ctx.options.pipeline, number, total, following.history):
        return None
    return lambda: speculate(ctx, following)


def speculate(ctx: Run, commit: CommitSpec) -> None:
    """Begin `commit` on the branch tip's tree; kept in `ctx.speculation`. An error is left
    for the serial run to meet where it belongs, so it discards the speculation here."""
    discard(ctx)
    stack = contextlib.ExitStack()
    held = Buffered(ctx.report.run_id)
    reporter, ctx.report = ctx.report, held
    envs_reporter, ctx.envs.report = ctx.envs.report, held  # a setup's events, too
    account = f"{commit.number} (speculative)"
    try:
        label = f"commit-{commit.number}"
        tip = ctx.tip()  # read once for this step: `opened` checks it again before any use
        tree = ctx.repo.tree_of(tip)
        warming = ctx.envs.warm(label, tree, ctx.place(tree, commit.number, tip))  # pre-warm
        if warming is None:  # nothing is begun that would run a setup, or hold a large tree
            return
        state = stack.enter_context(ctx.sandbox(label, commit.number, warming, tip))
        outcome = None
        if commit.paths is not None or ctx.agent is None or ctx.options.pipeline != Pipeline.FULL:
            state.box  # noqa: B018 - ready before this commit's turn
        else:  # while the container starts, the model is asked
            outcome = ask_extraction(ctx, commit, state, Extract(None, None, False),
                                     "extract (speculative)", account)
    except RetconError as exc:
        stack.close()
        _count_discarded(ctx, ctx.tokens.pop(account, 0))
        ctx.report, ctx.envs.report = reporter, envs_reporter
        ctx.report.emit("speculation", number=commit.number, kept=False, why=str(exc))
        return
    except BaseException:
        stack.close()
        _count_discarded(ctx, ctx.tokens.pop(account, 0))
        raise
    finally:
        ctx.report, ctx.envs.report = reporter, envs_reporter
    ctx.speculation = Speculation(commit.number, state.base_tree, state, stack, outcome,
                                  held.events, ctx.tokens.pop(account, 0))


@contextlib.contextmanager
def opened(ctx: Run, number: int) -> Iterator[tuple[WorkState, ToolOutcome | None]]:
    """Commit `number`'s working state, and the model's extraction already done into it: the
    speculation's, when `keep` says so, else a new state (and None). Pipelined, its sandbox is
    removed behind the next commit's back (`retire`)."""
    found, ctx.speculation = ctx.speculation, None
    commit = ctx.commit_spec(number)
    if found is not None and keep(found.number, found.base_tree, number, commit.history,
                                  ctx.repo.tree_of(ctx.tip())):
        if found.tokens:
            ctx.add_tokens(str(number), found.tokens)
        ctx.report.emit("speculation", number=number, kept=True)
        Buffered.replay(found.events, ctx.report)
        stack, state, asked = found.stack, found.state, found.outcome
    else:
        if found is not None:
            drop(ctx, found)
        stack = contextlib.ExitStack()
        state = stack.enter_context(ctx.sandbox(f"commit-{number}", number,
                                                ctx.take_handover()))
        asked = None
    try:
        yield state, asked
    finally:
        retire(ctx, stack)


def retire(ctx: Run, stack: contextlib.ExitStack) -> None:
    """Remove a finished commit's sandbox: pipelined, in a thread of its own (sandbox I/O only),
    so that the next commit does not wait for it; `settle` waits for them all."""
    if ctx.options.pipeline == Pipeline.OFF:
        stack.close()
        return

    def close() -> None:
        try:
            stack.close()
        except Exception as exc:  # raised by `settle`, in the run's thread
            ctx.retire_errors.append(exc)

    worker = threads.start(close, "retcon-remove")
    ctx.retiring.append(worker)


def settle(ctx: Run) -> list[Exception]:
    """Wait until every retired sandbox is removed; what went wrong removing them."""
    for worker in ctx.retiring:
        worker.join()
    ctx.retiring.clear()
    failed, ctx.retire_errors = ctx.retire_errors, []
    return failed


def discard(ctx: Run) -> None:
    """Drop the pending speculation, if any (a run that stops, or a newer speculation)."""
    found, ctx.speculation = ctx.speculation, None
    if found is not None:
        drop(ctx, found)


def drop(ctx: Run, found: Speculation) -> None:
    found.stack.close()
    _count_discarded(ctx, found.tokens)
    ctx.report.emit("speculation", number=found.number, kept=False)


def _count_discarded(ctx: Run, tokens: int) -> None:
    if tokens:
        ctx.add_tokens(DISCARDED, tokens)
