"""The command line. Every command returns an exit code; `main` maps our errors to exit codes
and readable messages (never a bare traceback).

Exit codes: 0 all complete and trees equal; 1 error; 2 usage; 3 stuck; 130 interrupted.
"""

from __future__ import annotations

import json
import signal
import sys
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

try:  # typer >= 0.2x vendors click; older releases raise click's own exceptions
    from typer import TyperException as UsageProblem
except ImportError:  # pragma: no cover
    from click import ClickException as UsageProblem  # type: ignore[assignment]

from runner import __version__
from runner.errors import EXIT_INTERRUPTED, EXIT_USAGE, RetconError

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Reconstruct a messy branch into clean, logical commits. Every build, "
                  "test and LLM file tool runs in an offline Docker container.")
images_app = typer.Typer(no_args_is_help=True, help="Build the sandbox images.")
app.add_typer(images_app, name="images")

_json_errors = False


class Skip(StrEnum):
    build = "build"
    test = "test"


class SandboxKind(StrEnum):
    docker = "docker"
    local = "local"


SpecArg = Annotated[Path, typer.Argument(help="The history spec (TOML).", show_default=False)]


def _exit(code: int) -> None:
    raise typer.Exit(code)


def execute(
    spec: SpecArg,
    build: Annotated[str | None, typer.Option(help="Build command (overrides [sandbox] build).")
                     ] = None,
    test: Annotated[str | None, typer.Option(help="Test command (overrides [sandbox] test).")
                    ] = None,
    skip: Annotated[list[Skip] | None, typer.Option(help="Skip the build or the tests.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name [env: RETCON_SANDBOX_MODEL].")
                     ] = None,
    base_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible endpoint [env: OPENAI_BASE_URL].")] = None,
    image: Annotated[str | None, typer.Option(help="Sandbox image (overrides [sandbox] image).")
                     ] = None,
    sandbox: Annotated[SandboxKind, typer.Option(
        help="Where untrusted steps run. `local` isolates nothing: for tests only.")
    ] = SandboxKind.docker,
    timeout: Annotated[float | None, typer.Option(help="Per-command timeout in seconds.")] = None,
    squash_wip: Annotated[bool, typer.Option(
        "--squash-wip", help="Fold fix commits into their logical commit at the end.")] = False,
    non_interactive: Annotated[bool, typer.Option(
        "--non-interactive", help="Never ask for a resolution note; stop with exit 3.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON event per line on stdout."
                                          )] = False,
) -> None:
    """Run or resume the reconstruction described by SPEC."""
    global _json_errors
    _json_errors = as_json
    from runner.commands import execute as command

    _exit(command.run(command.ExecuteOptions(
        spec=spec, build=build, test=test, skip=frozenset(s.value for s in skip or []),
        model=model, base_url=base_url, image=image, sandbox=sandbox.value,
        squash_wip=squash_wip, non_interactive=non_interactive, json=as_json, timeout=timeout)))


app.command("execute")(execute)
app.command("reconstruct", help="Alias of execute.")(execute)


@app.command()
def status(spec: SpecArg,
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False
           ) -> None:
    """Show each commit's state."""
    from runner.commands import status as command

    _exit(command.run(spec, as_json))


@app.command()
def prompt() -> None:
    """Print guidance for writing a spec, for a person or an agent."""
    from runner.commands import prompt as command

    _exit(command.run())


@app.command()
def clean() -> None:
    """Remove any sandbox containers left behind."""
    from runner.commands import clean as command

    _exit(command.run())


@app.command()
def demo(
    directory: Annotated[Path | None, typer.Option(help="Where to create the demo repository.")
                         ] = None,
    llm: Annotated[bool, typer.Option("--llm", help="Use hints and a model instead of paths.")
                   ] = False,
    model: Annotated[str | None, typer.Option(help="Model name [env: RETCON_SANDBOX_MODEL].")
                     ] = None,
    base_url: Annotated[str | None, typer.Option(help="Endpoint [env: OPENAI_BASE_URL].")
                        ] = None,
    sandbox: Annotated[SandboxKind, typer.Option(help="`local` isolates nothing.")
                       ] = SandboxKind.docker,
) -> None:
    """Build a messy demo repository and reconstruct it, all in the sandbox."""
    from runner.commands import demo as command

    _exit(command.run(directory, llm, model, base_url, sandbox.value))


@images_app.command("build")
def images_build(names: Annotated[list[str] | None, typer.Argument(
        help="Images to build (default: all).")] = None) -> None:
    """Build sandbox images from images/ (bootstrapping a base offline if needed)."""
    from runner.commands import images as command

    _exit(command.build(names or []))


@images_app.command("bootstrap")
def images_bootstrap() -> None:
    """Make a Debian base with debootstrap and docker import (no registry needed)."""
    from runner.commands import images as command

    _exit(command.bootstrap())


@images_app.command("list")
def images_list() -> None:
    """List the sandbox images and whether they are built."""
    from runner.commands import images as command

    _exit(command.listing())


@app.command()
def version() -> None:
    """Print the version."""
    print(f"retcon-sandbox {__version__}")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def report_error(exc: RetconError) -> None:
    if _json_errors:
        print(json.dumps({"event": "error", "kind": type(exc).__name__, "message": exc.message,
                          "hint": exc.hint, "exit_code": exc.exit_code}), flush=True)
    label = "stuck" if exc.exit_code == 3 else "error"
    sys.stderr.write(f"\n✗ {label}: {exc.message}\n")
    if exc.hint:
        sys.stderr.write("  " + exc.hint.replace("\n", "\n  ") + "\n")


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        # Without standalone mode, typer returns the exit code (of typer.Exit, and 130 for a
        # KeyboardInterrupt it caught) instead of exiting; errors propagate to us.
        code = app(args=argv, prog_name="retcon-sandbox", standalone_mode=False)
    except RetconError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
    except UsageProblem as exc:  # bad options or arguments: typer's own message, exit 2
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            sys.stderr.write(f"error: {exc}\n")
        sys.exit(getattr(exc, "exit_code", EXIT_USAGE))
    except (KeyboardInterrupt, typer.Abort):
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        sys.stderr.write("\n✗ interrupted: every finished step is saved in the spec; rerun the "
                         "same command to resume.\n")
    sys.exit(code if isinstance(code, int) else 0)
