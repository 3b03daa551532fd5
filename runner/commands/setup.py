"""Turning options, the spec and the environment into a backend and a model."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from runner.agent import Agent, StepLimits, Transcript
from runner.errors import ModelError, SpecError, UsageError
from runner.llm import ModelSettings, OpenAIChat
from runner.sandbox_api import Backend
from runner.spec import Spec

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class ModelOptions:
    model: str | None
    base_url: str | None

    def settings(self) -> ModelSettings | None:
        model = self.model or os.environ.get("RETCON_SANDBOX_MODEL")
        if not model:
            return None
        base_url = self.base_url or os.environ.get("OPENAI_BASE_URL")
        api_key = os.environ.get("OPENAI_API_KEY")
        if not api_key and not base_url:
            raise ModelError("a model is named but OPENAI_API_KEY is not set",
                             "Export OPENAI_API_KEY, or give --base-url for an endpoint that "
                             "needs no key (Ollama, vLLM).")
        attempts = int(os.environ.get("RETCON_SANDBOX_MODEL_ATTEMPTS", "6"))
        max_wait = float(os.environ.get("RETCON_SANDBOX_MODEL_MAX_WAIT", "20"))
        return ModelSettings(model, base_url, api_key, attempts=attempts, max_wait=max_wait)


def make_agent(settings: ModelSettings | None, spec_path: Path) -> Agent | None:
    if settings is None:
        return None
    transcript = Transcript(spec_path.with_name(spec_path.stem + ".transcript.jsonl"))
    return Agent(OpenAIChat(settings), transcript, StepLimits())


def require_model(spec: Spec, settings: ModelSettings | None) -> None:
    """Stop before doing anything if a pending commit needs a model and none is configured."""
    from runner.history import Done, next_step

    if settings is not None:
        return
    needing = [c for c in spec.commits
               if c.paths is None and not isinstance(next_step(list(c.history)), Done)]
    if needing:
        names = "\n".join(f"  #{c.number} {c.subject}" for c in needing)
        raise ModelError(
            f"these commits have no `paths` and need a model, but none is configured:\n{names}",
            "Give --model (or RETCON_SANDBOX_MODEL) and OPENAI_API_KEY, plus --base-url (or "
            "OPENAI_BASE_URL) for a non-OpenAI endpoint; or add `paths = [...]` to those commits.")


def sandbox_env(spec: Spec) -> dict[str, str]:
    """The explicit allowlist of host variables passed into sandboxes; never a secret."""
    env: dict[str, str] = {}
    for name in spec.sandbox.env:
        if SECRET_NAME.search(name):
            raise SpecError(f"{spec.path.name}: [sandbox] → env: {name!r} looks like a secret; "
                            "secrets never enter the sandbox")
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def make_backend(kind: str, spec: Spec, image: str | None) -> Backend:
    env = sandbox_env(spec)
    if kind == "local":
        from runner.local_backend import LocalBackend

        sys.stderr.write("⚠ --sandbox local: builds, tests and file tools run UNSANDBOXED on this "
                         "machine. Use it only for code you trust (and for our own tests).\n")
        return LocalBackend(env)
    if kind != "docker":
        raise UsageError(f"unknown sandbox {kind!r} (expected docker or local)")
    from runner import images
    from runner.docker_backend import DockerBackend, DockerEngine, Hardening

    engine = DockerEngine()
    tag = image or spec.sandbox.image or images.DEFAULT_IMAGE
    images.ensure(engine, tag, lambda line: print(line, file=sys.stderr))
    s = spec.sandbox
    hardening = Hardening(s.memory, s.cpus, s.pids, s.workspace_size, s.tmp_size)
    return DockerBackend(engine, tag, hardening, env, spec.path)
