"""One error hierarchy. The CLI maps each class to an exit code, a `kind` (the JSON `error`
event's field) and a readable message with a hint of what to do next.

Exit codes: 0 success; 1 an error (bad input, configuration, or Docker, git or the model
unavailable); 2 usage; 3 stuck (a human is needed); 4 `plan --check` found files
uncovered or covered twice; 130 interrupted.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from retcon_sandbox.text import plain_number

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_STUCK = 3
EXIT_UNCOVERED = 4  # `plan --check`: a spec leaves files uncovered or covers them twice
EXIT_INTERRUPTED = 130


class RetconError(Exception):
    """Base of every error we raise on purpose. `hint` says what to do next."""

    exit_code = EXIT_ERROR
    kind = "error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(RetconError):
    exit_code = EXIT_USAGE
    kind = "usage"


class SpecError(RetconError):
    """The spec file cannot be read, parsed or validated."""

    kind = "spec"


class ConfigError(RetconError):
    """A setting, command or environment cannot work as configured (not the code's fault)."""

    kind = "config"


class SetupError(ConfigError):
    """`[sandbox] setup` failed: the environment cannot be prepared as configured."""

    kind = "setup"


class ConcurrentEditError(RetconError):
    """The spec was changed on disk in a way a save cannot merge."""

    kind = "spec_edited"


class LockedError(RetconError):
    """Another run holds the spec's lock."""

    kind = "locked"


class GitError(RetconError):
    """A git operation failed or the repository is not in the expected state."""

    kind = "git"


class SandboxError(RetconError):
    """The sandbox could not be created, reached or trusted."""

    kind = "sandbox"


class ImageError(SandboxError):
    """An image could not be found, built or bootstrapped."""

    kind = "image"


class ModelError(RetconError):
    """The model endpoint cannot be used: not configured, refused, unreachable or too slow."""

    kind = "model"


class StuckError(RetconError):
    """A commit is stuck, or a verified commit fails: a human is needed."""

    exit_code = EXIT_STUCK
    kind = "stuck"


class InternalError(RetconError):
    """A bug of ours; the traceback is in a log file."""

    kind = "internal"


class Interrupted(RetconError):
    """Ctrl-C or SIGTERM."""

    exit_code = EXIT_INTERRUPTED
    kind = "interrupted"


MAX_SETTING = 1e9  # seconds (31 years) or a count: beyond what a timer or a loop can take


def env_number(name: str, default: float, integer: bool = False, meaning: str = "",
               maximum: float = MAX_SETTING) -> float:
    """A setting from the environment variable `name`: `default` when unset or blank, else a
    number (a whole one if `integer`) greater than 0 and at most `maximum`, or a ConfigError
    that names the variable and what to set it to (`meaning`: what the number is, for that
    hint)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(int(raw)) if integer else float(raw)
    except (ValueError, OverflowError):  # not a number; a whole number too large for a float
        value = math.nan
    if math.isfinite(value) and 0 < value <= maximum:
        return value
    kind = "a whole number" if integer else "a number"
    allowed = f"{kind} greater than 0 and at most {plain_number(maximum)}"
    raise ConfigError(f"{name}={_shown(raw)} is not {allowed}",
                      f"Set {name} to {meaning or allowed}, or unset it (default "
                      f"{plain_number(default)}).")


def _shown(raw: str, limit: int = 40) -> str:
    """A value as typed, quoted, and cut short when it is long (a number of 400 digits)."""
    return repr(raw) if len(raw) <= limit else repr(raw[:limit]) + f"… ({len(raw)} characters)"


def log_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(state) / "retcon-sandbox"


def internal_error(exc: BaseException, about: Callable[[], str] | None = None) -> InternalError:
    """A bug of ours: keep the traceback in a log file and say where it is. `about`: the
    versions a bug report needs, written above the traceback."""
    text = _about(about) + "".join(traceback.format_exception(exc))
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for directory in (log_dir(), Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / name
            path.write_text(text, encoding="utf-8")
            break
        except OSError:
            continue
    else:
        path = Path("(could not be written)")
    return InternalError(f"internal error: {type(exc).__name__}: {exc}",
                         f"This is a bug in retcon-sandbox, not in your input. The traceback is "
                         f"in {path}; please report it with that file.")


def _about(about: Callable[[], str] | None) -> str:
    if about is None:
        return ""
    try:
        return about().rstrip("\n") + "\n\n"
    except Exception as exc:  # the traceback matters more than the versions
        return f"(versions unavailable: {type(exc).__name__}: {exc})\n\n"
