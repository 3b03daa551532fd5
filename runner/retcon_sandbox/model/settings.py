"""How to reach the model: its name, endpoint, key and limits, as the command line, the
environment and the spec give them. Apart from the adapter (model/llm.py), which imports
openai (about a second of CPU), so that a command can check them, and go on with its other
checks, while that import runs in a thread of its own (`prefetch`)."""

from __future__ import annotations

from dataclasses import dataclass

from retcon_sandbox import threads

DEFAULT_URL = "https://api.openai.com/v1"


@dataclass(frozen=True)
class ModelSettings:
    model: str
    base_url: str | None
    api_key: str | None
    attempts: int = 6
    max_wait: float = 20.0
    timeout: float = 120.0
    deadline: float = 600.0
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    tokens_name: str = "max_tokens"  # the reply-length parameter's name tried first
    stream: bool = True  # ask for the answer as it is made (its tokens, for the progress lines)

    @property
    def endpoint(self) -> str:
        return self.base_url or DEFAULT_URL


def prefetch() -> None:
    """Import the adapter (and openai) in a thread of its own while the caller goes on, as
    `engine.prefetch` does the engine's SDK: a run that names a model spends its spec's,
    repository's and engine's checks, mostly waiting for git and the engine, importing it too.
    A failed import is left for the first use to raise."""
    threads.import_ahead("retcon_sandbox.model.llm")
