"""`retcon-sandbox man`: a man page (roff), generated from the argparse parsers themselves, as
the completion scripts are, so it cannot drift from them.

One page: the synopsis, every command and subcommand with its description and options, the
exit codes and the environment variables read. Read it with `retcon-sandbox man | man -l -`, or
install it: `retcon-sandbox man > ~/.local/share/man/man1/retcon-sandbox.1`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from retcon_sandbox import __version__
from retcon_sandbox.errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STUCK,
    EXIT_UNCOVERED,
    EXIT_USAGE,
)

EXIT_CODES = (
    (EXIT_OK, "every commit complete and the cleaned tree equal to the source's; for verify, "
              "every commit passed"),
    (EXIT_ERROR, "an error: bad input or configuration, or Docker, git or the model unavailable"),
    (EXIT_USAGE, "usage: an unknown option or command, a malformed --base-url"),
    (EXIT_STUCK, "a human is needed: a commit is stuck (add `resolved` to the spec and rerun), "
                 "or verify found a failing commit"),
    (EXIT_UNCOVERED, "plan --check: a changed file is in no commit, or in two"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM, SIGHUP); everything finished is saved, "
                       "rerun to resume"),
)
ENVIRONMENT = (
    ("OPENAI_BASE_URL", "the model's OpenAI-compatible endpoint (--base-url)"),
    ("OPENAI_API_KEY", "the model endpoint's API key"),
    ("RETCON_SANDBOX_MODEL", "the model's name (--model)"),
    ("RETCON_SANDBOX_MODEL_TIMEOUT", "seconds to wait for one model response (--model-timeout)"),
    ("RETCON_SANDBOX_MODEL_DEADLINE", "no retry of a model request whose wait ends later than "
                                      "this many seconds after its first try"),
    ("RETCON_SANDBOX_MODEL_STREAM", "0: ask for each answer whole, not streamed (streamed "
                                    "answers show their tokens in the progress lines)"),
    ("RETCON_SANDBOX_NOTES_KEY", "the key that authenticates verify's cached results"),
    ("RETCON_SANDBOX_HEARTBEAT", "seconds between progress lines of a long step off a terminal "
                                 "(default 15)"),
    ("DOCKER_HOST", "the Docker engine (--engine), else the docker CLI's current context"),
    ("RETCON_SANDBOX_ENGINE_TIMEOUT", "seconds the Docker engine has to answer"),
    ("RETCON_SANDBOX_IMAGE_PREFIX", "where the sandbox images are tagged"),
    ("NO_COLOR", "plain output: no live lines or tables redrawn in place"),
)


def roff(text: str) -> str:
    """Text for a roff line: backslashes and dashes escaped, and a line that would start with a
    control character (`.` or `'`) guarded by a zero-width `\\&`."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line
                     for line in text.splitlines())


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def _option(action: argparse.Action) -> str:
    """`\\fB\\-\\-engine\\fR \\fIHOST|CONTEXT\\fR`, or a positional's metavar."""
    if not action.option_strings:
        return f"\\fI{roff(str(action.metavar or action.dest))}\\fR"
    names = ", ".join(f"\\fB{roff(o)}\\fR" for o in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}")
                                 if action.choices else action.dest.upper())
    return f"{names} \\fI{roff(str(metavar))}\\fR"


def _commands(parser: argparse.ArgumentParser, path: str
              ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{path} {name}", child
                yield from _commands(child, f"{path} {name}")


def _section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    lines = [f'.SS "{roff(name)}"', ".PP", roff(" ".join(usage.split()))]
    if parser.description:
        lines += [".PP", roff(parser.description)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        lines += [".TP", _option(action), roff(_help(parser, action) or "")]
    return lines


def _first_sentence(text: str | None) -> str:
    first = (text or "").split(". ")[0].rstrip(".")
    return first[:1].lower() + first[1:]


def page(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    lines = [f'.TH "{roff(prog.upper())}" 1 "" "{roff(prog)} {__version__}" "User Commands"',
             ".SH NAME", f"{roff(prog)} \\- {roff(_first_sentence(parser.description))}",
             ".SH SYNOPSIS", f"\\fB{roff(prog)}\\fR [\\fB\\-q\\fR | \\fB\\-v\\fR] "
             "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]", ".SH COMMANDS"]
    for name, child in _commands(parser, prog):
        lines += _section(name, child)
    lines += [".SH EXIT STATUS"]
    for code, meaning in EXIT_CODES:
        lines += [".TP", f"\\fB{code}\\fR", roff(meaning)]
    lines += [".SH ENVIRONMENT"]
    for name, meaning in ENVIRONMENT:
        lines += [".TP", f"\\fB{roff(name)}\\fR", roff(meaning)]
    lines += [".SH SEE ALSO", f"{roff(prog)} prompt (how to write a history spec); "
              f"{roff(prog)} completion bash|zsh|fish"]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    print(page(args.build_parser()), end="")
    return EXIT_OK
