"""The verify pool on the local backend: every tree once, with or without the look-ahead, over
one or several sets of environments (engines), and where the time went."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.backends.api import HelperSandbox
from retcon_sandbox.backends.environments import Environments
from retcon_sandbox.backends.hostaccess import HostAccess
from retcon_sandbox.backends.local import LocalBackend
from retcon_sandbox.errors import SandboxError
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import JsonReporter
from retcon_sandbox.spec.settings import DEFAULTS
from retcon_sandbox.verify.cache import Outcome
from retcon_sandbox.verify.pool import Item, Pool
from retcon_sandbox.verify.stages import Commands, Verifier


def project(path: Path, commits: int) -> tuple[Repo, list[str]]:
    repo = Repo.init(path, "main")
    trees = []
    for k in range(commits):
        repo.commit_files("main", {"ok.txt": "yes\n" if k % 3 else "no\n", f"f{k}": "x\n"},
                          f"commit {k}")
        trees.append(repo.tree_of("main"))
    return repo, trees


@pytest.mark.parametrize("ahead", [True, False])
def test_every_tree_once_over_two_sets_of_environments(tmp_path: Path, ahead: bool) -> None:
    repo, trees = project(tmp_path / "repo", 5)
    reporter = JsonReporter(io.StringIO())
    first = Environments(repo, LocalBackend({}), DEFAULTS, HostAccess().setup, reporter, "main")
    envs = [first, Environments(repo, LocalBackend({}), DEFAULTS, HostAccess().setup, reporter,
                                "main", git_lock=first.git_lock)]
    verifier = Verifier(Commands(None, "grep -q yes ok.txt", 60), reporter)
    pool = Pool(repo, envs[0], verifier, 2, envs[1:], ahead=ahead)
    finished: list[tuple[str, Outcome]] = []
    results = pool.run([Item(t, f"t{k}") for k, t in enumerate([*trees, trees[0]])],
                       lambda item, outcome: finished.append((item.tree, outcome)))
    assert sorted(t for t, _ in finished) == sorted(trees)  # each once, the repeat not again
    assert [results[t].passed for t in trees] == [False, True, True, False, True]
    assert pool.phases.counts["commands"] == 5 == pool.phases.counts["create"]
    assert pool.phases.counts["remove"] == 5  # every sandbox removed before run returns
    assert sum(pool.spread.values()) == 5


def test_the_engines_share_one_git_lock(tmp_path: Path) -> None:
    repo, _ = project(tmp_path / "repo", 1)
    reporter = JsonReporter(io.StringIO())
    envs = [Environments(repo, LocalBackend({}), DEFAULTS, HostAccess().setup, reporter, "main")
            for _ in range(2)]
    with pytest.raises(ValueError, match="share one git lock"):
        Pool(repo, envs[0], Verifier(Commands(None, "true", 60), reporter), 2, envs[1:])


class _LeavesOneBehind(LocalBackend):
    """An engine that cannot remove one sandbox (a real local sandbox, whose removal then
    reports an error as the Docker backend's does)."""

    @contextlib.contextmanager
    def open(self, label: str) -> Iterator[HelperSandbox]:
        with super().open(label) as box:
            yield box
        if label == "t1":
            raise SandboxError("cannot remove the sandbox t1: the engine refused")


def test_a_sandbox_that_cannot_be_removed_is_reported_after_every_result(tmp_path: Path) -> None:
    repo, trees = project(tmp_path / "repo", 3)
    reporter = JsonReporter(io.StringIO())
    envs = Environments(repo, _LeavesOneBehind({}), DEFAULTS, HostAccess().setup, reporter,
                        "main")
    pool = Pool(repo, envs, Verifier(Commands(None, "grep -q yes ok.txt", 60), reporter), 2)
    finished: list[str] = []
    with pytest.raises(SandboxError, match="cannot remove the sandbox t1") as raised:
        pool.run([Item(t, f"t{k}") for k, t in enumerate(trees)],
                 lambda item, _: finished.append(item.tree))
    assert sorted(finished) == sorted(trees)  # the results were all recorded first
    assert "retcon-sandbox clean" in raised.value.hint
