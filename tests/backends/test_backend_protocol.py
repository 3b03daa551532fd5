"""The `Backend` Protocol fits a backend that is neither Docker nor local (a Kubernetes backend
would be one, docs/scaling.md): the loop's sandboxes open through it alone, and what stays
Docker's (prepared environments) is said, naming the backend in use."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.api import Backend, Preparation, Preparer, Sandbox
from retcon_sandbox.backends.environments import Environments
from retcon_sandbox.backends.local import LocalBackend
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import JsonReporter
from retcon_sandbox.spec.settings import SandboxSettings


class PodLike:
    """Another backend, by the Protocol only: here the helper runs as the local backend runs
    it, behind a name of its own (a pod's exec stream would carry the same bytes)."""

    name = "pods"

    def __init__(self) -> None:
        self._inner = LocalBackend()
        self.opened: list[str] = []

    @contextmanager
    def _open(self, label: str) -> Iterator[Sandbox]:
        self.opened.append(label)
        with self._inner.open(label) as box:
            yield box

    def open(self, label: str) -> AbstractContextManager[Sandbox]:
        return self._open(label)

    def reap(self) -> int:
        return 0

    def describe(self) -> str:
        return "pods (test)"

    def engine_name(self) -> str:
        return self.name

    def preparer(self, job: Preparation) -> Preparer | None:
        return None

    def environment(self) -> str:
        return "pods image@sha256:0"


def test_a_backend_by_the_protocol_alone_runs_sandboxes_and_says_setup_is_not_run(
        tmp_path: Path) -> None:
    repo = Repo.init(tmp_path / "r")
    tree = repo.tree_of(repo.commit_files("main", {"app.py": "print(1)\n"}, "one"))
    backend: Backend = PodLike()
    out = io.StringIO()
    settings = SandboxSettings.parse({"setup": ["pip install -r requirements.txt"]})
    policy = hostaccess.from_command_line([], False, "registries", [], hostaccess.SETUP_DISK,
                                          hostaccess.KEEP_ENVIRONMENTS).setup
    envs = Environments(repo, backend, settings, policy, JsonReporter(out), "main")
    assert envs.prepared_id(tree) == ""  # no prepared environment: nothing keys the cache by one
    with envs.sandbox("verify-x", tree) as opened:
        assert opened.files == 1 and opened.environment is None
        assert opened.box.run("cat app.py", 30).output == "print(1)\n"
    assert isinstance(backend, PodLike) and backend.opened == ["verify-x"]
    warnings = [e["message"] for e in map(json.loads, out.getvalue().splitlines())
                if e["event"] == "warning"]
    assert warnings == ["--sandbox pods does not run [sandbox] setup: its sandboxes start from "
                        "the image as it is"]
