"""One error hierarchy; the CLI maps each class to an exit code and a readable message."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_STUCK = 3
EXIT_INTERRUPTED = 130


class RetconError(Exception):
    """Base of every error we raise on purpose. `hint` says what to do next."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(RetconError):
    exit_code = EXIT_USAGE


class SpecError(RetconError):
    """The spec file cannot be read, parsed or validated."""


class ConcurrentEditError(RetconError):
    """The spec was changed on disk in a way a save cannot merge."""


class LockedError(RetconError):
    """Another run holds the spec's lock."""


class GitError(RetconError):
    """A git operation failed or the repository is not in the expected state."""


class SandboxError(RetconError):
    """The sandbox could not be created, reached or trusted."""


class ImageError(SandboxError):
    """An image could not be found, built or bootstrapped."""


class ModelError(RetconError):
    """The model endpoint failed after retries, or is not configured."""


class StuckError(RetconError):
    """A commit is stuck and needs a human."""

    exit_code = EXIT_STUCK


class Interrupted(RetconError):
    """Ctrl-C or SIGTERM."""

    exit_code = EXIT_INTERRUPTED
