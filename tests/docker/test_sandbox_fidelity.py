"""A sandbox opened on one tree whose files then become another tree's in place (a `paths`
commit's changes put in a sandbox opened ahead) shows a command what a sandbox opened on the
second tree shows: every file, its mode and type, every folder, and the git metadata (HEAD,
index, refs, reflog, status, version). The whole runs compare in every mode in
test_execute_pipeline_docker.py."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.api import Sandbox
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.environments import Environments
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import JsonReporter
from tests.branches import write_branch
from tests.docker.conftest import SMALL, ours
from tests.docker.test_execute_pipeline_docker import paths_scenario

# What a command can see of its workspace (the tmpfs's own folder sizes and times aside).
SEEN = """\
set -e
git rev-parse HEAD 'HEAD^{tree}'
git status --porcelain --untracked-files=all --ignored
git for-each-ref --format='%(refname) %(objectname)'
git ls-files -s
git log --format='%H %T %P %s'
git reflog --format='%H %gs'
git describe --tags --long
find . -path ./.git -prune -o -printf '%y %m %u %g %p -> %l\\n' | LC_ALL=C sort
find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
"""


def test_a_sandbox_changed_in_place_shows_a_command_what_a_fresh_one_does(
        engine: DockerEngine, tmp_path: Path) -> None:
    base, commits = paths_scenario()
    write_branch(tmp_path / "repo", base, commits, "", tag="v0.1")
    repo = Repo(tmp_path / "repo")
    first, second = repo.tree_of("main"), repo.tree_of("feature~2")
    backend = DockerBackend(engine, sandboximages.default_image(), SMALL, {},
                            tmp_path / "spec.toml")
    envs = Environments(repo, backend, SMALL, hostaccess.HostAccess().setup,
                        JsonReporter(io.StringIO()), "feature")
    at = (repo.resolve("main"), 1)
    with contextlib.ExitStack() as stack:
        def open_box(tree: str) -> Sandbox:
            return stack.enter_context(envs.sandbox("fidelity", tree, at)).box

        state = WorkState(repo, open_box, first, "feature", SMALL.max_file_size, None,
                          lambda box, tree: envs.retree(box, tree, at))
        opened = state.box  # on the first tree, as a sandbox opened ahead is
        for path, entry in repo.tree_changes(first, second):
            state.put(path, entry)  # plain changes only: taken in place
        assert state.tree() == second and state.box is opened
        reused = state.command_box.run(SEEN, 60)
        fresh = open_box(second).run(SEEN, 60)
    assert reused.passed and fresh.passed, reused.output + fresh.output
    assert reused.output == fresh.output
    head, tree = reused.output.split()[:2]
    assert tree == second and head != tree
    assert "v0.1-1-g" in reused.output and "docs/README.md" in reused.output
    assert not ours(engine, tmp_path)
