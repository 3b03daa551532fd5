"""The standard streams of a command: any text written in any encoding, a closed stdout
stopping the command quietly, and an error said on stderr (and as a `--json` event). Moved
out of cli.py, which keeps the parsers and the one handler that maps errors to exit codes."""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
from typing import Any, TextIO

from retcon_sandbox.errors import RetconError
from retcon_sandbox.report import JsonReporter
from retcon_sandbox.text import sanitize


class StdoutClosed(Exception):
    """Whoever reads our standard output went away (`retcon-sandbox status spec | head -1`)."""


class Stdout:
    """sys.stdout, with a write to a closed pipe turned into `StdoutClosed`: a broken pipe
    elsewhere (a sandbox's, a subprocess's) stays what it is."""

    def __init__(self, wrapped: TextIO) -> None:
        self._wrapped = wrapped

    def write(self, text: str) -> int:
        try:
            return self._wrapped.write(text)
        except BrokenPipeError:
            raise StdoutClosed from None

    def flush(self) -> None:
        try:
            self._wrapped.flush()
        except BrokenPipeError:
            raise StdoutClosed from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def discard_stdout() -> None:
    """Point stdout at /dev/null, so nothing (not even the final flush) writes to the pipe."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
        os.close(devnull)


def report_error(exc: RetconError, as_json: bool) -> None:
    if as_json:
        with contextlib.suppress(StdoutClosed, OSError):
            JsonReporter().emit("error", kind=exc.kind, message=exc.message, hint=exc.hint,
                                exit_code=exc.exit_code)
    label = exc.kind if exc.kind in ("stuck", "interrupted") else "error"
    sys.stderr.write(sanitize(f"\n✗ {label}: {exc.message}\n"))
    if exc.hint:
        sys.stderr.write(sanitize("  " + exc.hint.replace("\n", "\n  ") + "\n"))


_PLAIN = {"✓": "ok", "✗": "x", "⚠": "!", "…": "...", "→": "->", "—": "-", "–": "-", "·": "-"}


def _plainer(exc: UnicodeError) -> tuple[str, int]:
    """For an output encoding that lacks a character (PYTHONIOENCODING=ascii, a latin-1
    terminal): our symbols in ASCII, anything else as a `\\uXXXX` escape (which keeps a
    `--json` line valid JSON), never a crash."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    chars = exc.object[exc.start:exc.end]
    return "".join(_PLAIN.get(c) or _json_escape(c) for c in chars), exc.end


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


codecs.register_error("retcon-sandbox", _plainer)


def encode_anything() -> None:
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="retcon-sandbox")
