"""The spec's `[model]` table: which model, and how it samples. The endpoint and its key are
never read from a spec (someone else's spec could send your API key to their server): they come
from the command line and the environment only. The command line wins over the table."""

from __future__ import annotations

from dataclasses import dataclass

from retcon_sandbox.spec.settings import SettingError, number, text

MODEL_KEYS = ("name", "temperature", "max_tokens", "seed")
# Keys a user may try, refused with the reason rather than "unknown".
COMMAND_LINE_ONLY = {
    "base_url": "the endpoint is chosen on the command line only (--base-url or "
                "OPENAI_BASE_URL): a spec from someone else could send your API key to their "
                "server",
    "api_key": "the API key comes from OPENAI_API_KEY only, never from a spec",
}
COMMAND_LINE_ONLY.update({"url": COMMAND_LINE_ONLY["base_url"],
                          "endpoint": COMMAND_LINE_ONLY["base_url"],
                          "api_base": COMMAND_LINE_ONLY["base_url"],
                          "key": COMMAND_LINE_ONLY["api_key"]})

temperature = number(0, 2)
# Not in the table but on the command line and in the environment: past these, a value means
# "for ever" and would overflow the timers (a timeout of 1e300 s).
MAX_MODEL_SECONDS = 86400.0  # a model's timeout, deadline or wait between attempts: one day
MAX_MODEL_ATTEMPTS = 1000
max_tokens = number(1, 10_000_000, integer=True)
seed = number(0, 2**63 - 1, integer=True)


@dataclass(frozen=True)
class ModelTable:
    name: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None

    @classmethod
    def parse(cls, values: dict[str, object]) -> ModelTable:
        """From a `[model]` table; raises SettingError(key, message)."""
        parsers = {"name": text, "temperature": temperature, "max_tokens": max_tokens,
                   "seed": seed}
        parsed: dict[str, object] = {}
        for key, value in values.items():
            if key in COMMAND_LINE_ONLY:
                raise SettingError(key, COMMAND_LINE_ONLY[key])
            try:
                parsed[key] = parsers[key](value)
            except SettingError as exc:
                raise SettingError(key, str(exc)) from None
        return cls(**parsed)  # type: ignore[arg-type]


NO_MODEL = ModelTable()
