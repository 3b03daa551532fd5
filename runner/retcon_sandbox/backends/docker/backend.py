"""The Docker backend, as the `Backend` Protocol sees it: the run's containers
(`sandboxes.py`) and the environments prepared for them (`preparer.py`). A module of its own
so that neither of those imports the other."""

from __future__ import annotations

from retcon_sandbox.backends.api import Preparation
from retcon_sandbox.backends.docker.preparer import DockerPreparer
from retcon_sandbox.backends.docker.sandboxes import DockerSandboxes


class DockerBackend(DockerSandboxes):
    def preparer(self, job: Preparation) -> DockerPreparer:
        return DockerPreparer(job, self)
