"""The command line: the parsers, and the one handler that maps errors to exit codes.

Each command lives in `retcon_sandbox.commands.<name>` and returns an exit code; it is imported
only when it runs, so `--help` stays fast. Every exception ends here as a short message and an
exit code (see `errors.py`), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import math
import platform
import re
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, TextIO, cast

from retcon_sandbox import __version__
from retcon_sandbox.backends.hostaccess import SETUP_NETWORKS
from retcon_sandbox.errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    Interrupted,
    RetconError,
    UsageError,
    internal_error,
)
from retcon_sandbox.pipeline import Pipeline
from retcon_sandbox.report import set_verbosity
from retcon_sandbox.stdio import (
    Stdout,
    StdoutClosed,
    discard_stdout,
    encode_anything,
    report_error,
)
from retcon_sandbox.text import plain_number, url_problem
from retcon_sandbox.verify.shard import Shard, parse_shard

PROG = "retcon-sandbox"
# sandboximages.CATALOG's names (tested), without importing it
IMAGE_NAMES = ("base", "node", "rust")


# --- argument types: refuse what cannot be meant, with argparse's own usage error -------------


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        finite = "finite " if math.isinf(value) else ""  # 1e400 is a float's infinity
        raise argparse.ArgumentTypeError(f"expected a {finite}number greater than 0, got "
                                         f"{text!r}")
    return value


def model_seconds(text: str) -> float:
    """--model-timeout: a number of seconds greater than 0, at most a day."""
    from retcon_sandbox.spec.modeltable import MAX_MODEL_SECONDS

    value = positive_float(text)
    if value > MAX_MODEL_SECONDS:
        raise argparse.ArgumentTypeError(f"expected a number of seconds of at most "
                                         f"{plain_number(MAX_MODEL_SECONDS)}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number greater than 0, got {text!r}")
    return value


def shard_option(text: str) -> Shard:
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size_option(text: str) -> int:
    """A size with a unit (`4g`, `512m`), as the spec's sizes are written."""
    from retcon_sandbox.spec.settings import GIB, KIB, SettingError, size

    try:
        return size(KIB, 1024 * GIB)(text)
    except SettingError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 2:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 2, got {text!r}")
    return value


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 2**63 - 1:  # the spec's bound: the largest seed an endpoint takes
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 2**63-1, got "
                                         f"{text!r}")
    return value


def base_url(text: str) -> str:
    problem = url_problem(text)
    if problem:
        shown = repr(text) if len(text) <= 120 else f"{text[:120]!r}… ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown} is not an endpoint's base URL: {problem}")
    return text


# --- the parsers ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors that name the command and suggest `-h`. A value that starts
    with a minus and a digit (`--setup-disk -1g`, `--shard -1/2`) is taken as the option's
    value, to be refused by its type naming it (argparse took it for an unknown option: "expected
    one argument"); no option of ours looks like one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: {message}", f"Run `{self.prog} -h` for help.")


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model name [env: RETCON_SANDBOX_MODEL]")
    parser.add_argument("--base-url", type=base_url,
                        help="OpenAI-compatible endpoint [env: OPENAI_BASE_URL]")
    parser.add_argument("--model-timeout", type=model_seconds, metavar="S",
                        help="seconds to wait for one model response "
                        "[env: RETCON_SANDBOX_MODEL_TIMEOUT; default 120]")
    parser.add_argument("--temperature", type=temperature, metavar="T",
                        help="sampling temperature, 0 to 2 (overrides [model] temperature)")
    parser.add_argument("--max-tokens", type=positive_int, metavar="N",
                        help="most tokens in one model reply (overrides [model] max_tokens)")
    parser.add_argument("--seed", type=seed, metavar="N",
                        help="sampling seed, for endpoints that honour one (overrides [model] "
                        "seed)")


def _repo_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", metavar="DIR", help="the repository (default: the one that "
                        "contains the current directory, else the spec's directory)")


def _sandbox_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sandbox", choices=("docker", "local"), default="docker",
                        help="where untrusted steps run; `local` isolates nothing (for tests "
                        "only)")
    parser.add_argument("--engine", action="append", metavar="HOST|CONTEXT", default=[],
                        help="the Docker engine to use (unix://, tcp://, ssh:// or a docker "
                        "context's name; default: DOCKER_HOST, else the current context). "
                        "`verify` takes it several times and spreads its sandboxes over them")
    parser.add_argument("--pass-env", action="append", metavar="NAME",
                        help="pass this host variable into every sandbox (repeatable; refused "
                        "when it looks like a credential). The spec cannot do this")
    parser.add_argument("--allow-pull", action="store_true",
                        help="let the engine pull an image that is not present and not ours "
                        "(never done otherwise)")
    parser.add_argument("--setup-network", choices=SETUP_NETWORKS, default="registries",
                        help="what [sandbox] setup may reach: the package registries only "
                        "(default), the full network, or nothing")
    parser.add_argument("--setup-registry", action="append", metavar="HOST",
                        help="let setup also reach HOST (a private index or mirror; "
                        "\".example.com\" for every host under it; repeatable)")
    parser.add_argument("--setup-allow-address", action="append", metavar="ADDR",
                        help="let setup's egress proxy connect to ADDR (an address or a "
                        "network) although it is in a documentation, private or reserved range: "
                        "a network whose resolver answers there, a private mirror (repeatable; "
                        "never loopback, link-local or the engine host)")
    parser.add_argument("--setup-disk", type=size_option, metavar="SIZE", default="4g",
                        help="the most a [sandbox] setup may write into its environment "
                        "(default 4g); above it the run stops and nothing is kept. The "
                        "package cache is held to it too: above it, the cache is removed")
    parser.add_argument("--keep-environments", type=positive_int, metavar="N", default=3,
                        help="prepared environments kept per repository (default 3); the "
                        "oldest beyond are removed when a new one is made")
    parser.add_argument("--no-package-cache", action="store_true",
                        help="set up without the repository's package cache (pip, uv, npm and "
                        "cargo downloads kept between setups of the same setup commands)")


def _limit_options(parser: argparse.ArgumentParser) -> None:
    """The resource limits: a spec can only lower them below their defaults; these raise
    them (up to what the Docker engine has)."""
    parser.add_argument("--setup-timeout", type=positive_float, metavar="S",
                        help="seconds the whole [sandbox] setup may take (overrides [sandbox] "
                        "setup_timeout; the only way above the default 1800)")
    parser.add_argument("--memory", metavar="SIZE", help="memory limit per sandbox (overrides "
                        "[sandbox] memory; the only way above the default 2g)")
    parser.add_argument("--cpus", type=positive_float, metavar="N", help="CPU limit per "
                        "sandbox (overrides [sandbox] cpus; the only way above the default 2)")
    parser.add_argument("--pids", type=positive_int, metavar="N", help="process limit per "
                        "sandbox (overrides [sandbox] pids; the only way above the default 512)")
    parser.add_argument("--workspace-size", metavar="SIZE", help="size of the /workspace tmpfs "
                        "(overrides [sandbox] workspace_size; the only way above 2g)")
    parser.add_argument("--tmp-size", metavar="SIZE", help="size of the /tmp tmpfs (overrides "
                        "[sandbox] tmp_size; the only way above 512m)")


def _cache_options(parser: argparse.ArgumentParser, parallel: str) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="build and test every tree again, even those with a cached result "
                        "(new results are still recorded), and prepare every [sandbox] setup "
                        "environment again")
    parser.add_argument("-j", "--jobs", type=positive_int, metavar="N",
                        help=f"sandboxes at a time for {parallel} (default: the number of cores)")
    parser.add_argument("--no-reuse", action="store_true",
                        help="a new container for every tree (by default a used one takes the "
                        "next tree of the same environment once wiped: only when no process, "
                        "file, socket or IPC object of the last tree's is left; else it is "
                        "replaced)")
    parser.add_argument("--trust-notes", action="store_true",
                        help="also believe cached results that your key does not authenticate "
                        "(claimed by others: whoever can push refs/notes/retcon-sandbox)")


def _summary_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summary", metavar="FILE",
                        help="append a Markdown summary of the run to FILE, e.g. "
                        "\"$GITHUB_STEP_SUMMARY\" (a GitHub Actions job summary)")


def _execute(sub: argparse._SubParsersAction[_Parser]) -> None:
    for name in ("execute", "reconstruct"):
        p = sub.add_parser(name, help="run or resume the reconstruction of SPEC" if name ==
                           "execute" else "alias of execute",
                           description="Run or resume the reconstruction described by SPEC.")
        p.add_argument("spec", metavar="SPEC", help="the history spec (TOML)")
        _repo_option(p)
        p.add_argument("--build", metavar="CMD", help="build command (overrides [sandbox] build)")
        p.add_argument("--test", metavar="CMD", help="test command (overrides [sandbox] test)")
        p.add_argument("--skip", action="append", choices=("build", "test"), default=[],
                       help="skip the build or the tests (repeatable)")
        p.add_argument("--image", help="sandbox image (overrides [sandbox] image)")
        _model_options(p)
        _sandbox_option(p)
        p.add_argument("--timeout", type=positive_float, metavar="S",
                       help="per-command timeout in seconds (overrides [sandbox] timeout; the "
                       "only way above the default 600)")
        _limit_options(p)
        p.add_argument("--squash-wip", action="store_true",
                       help="fold fix commits into their logical commit at the end (each "
                       "squashed tree is verified first)")
        _cache_options(p, "the squash check")
        p.add_argument("--pipeline", dest="pipeline", action="store_const", const=Pipeline.FULL,
                       help="while a commit builds and tests, also let the model extract the "
                       "next one ahead, kept only if the commit needed no fix (the same history "
                       "as without). Default: the pre-warm: only the next sandbox is prepared "
                       "ahead (nothing over ssh://)")
        p.add_argument("--no-pipeline", dest="pipeline", action="store_const", const=Pipeline.OFF,
                       help="one thing at a time: not even the next sandbox is prepared ahead")
        p.add_argument("--strict-provenance", action="store_true",
                       help="stop (stuck) at a commit that gives a path content found in neither "
                       "the base nor the source, until a human resolves it")
        p.add_argument("--accept-provenance", action="store_true",
                       help="release the --strict-provenance stops already recorded in SPEC "
                       "(recorded as `resolved`), once you have checked the paths they name")
        p.add_argument("--adopt-branch", action="store_true",
                       help="work on an existing cleaned branch that this spec's runs did not "
                       "create (its commits are kept under the new ones)")
        p.add_argument("--no-base-check", action="store_true",
                       help="do not build and test the base commit when the first commit "
                       "fails (by default a base that fails for a missing module or crate "
                       "stops the run, naming it and the [sandbox] setup recipe)")
        p.add_argument("--non-interactive", action="store_true",
                       help="never ask for a resolution note; stop with exit 3")
        p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
        _summary_option(p)
        p.set_defaults(command="execute")


def _verify(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "verify", help="build and test every commit of a range, N sandboxes at a time",
        description="Build and test every commit of a range, each in a sandbox as new (a fresh "
        "container, or a used one wiped and checked), N at a time, through the verification "
        "cache (git notes under refs/notes/retcon-sandbox). Exit 0 when every commit passes, "
        "3 when one fails.")
    p.add_argument("target", nargs="?", metavar="SPEC | REV-RANGE",
                   help="a spec (its cleaned branch, from the merge-base of source and remote) "
                   "or a revision range such as main..feature (one revision alone: that "
                   "commit only)")
    p.add_argument("--spec", metavar="FILE", help="take the commands and sandbox settings "
                   "from this spec (for a revision range)")
    _repo_option(p)
    p.add_argument("--build", metavar="CMD", help="build command (overrides the spec's)")
    p.add_argument("--test", metavar="CMD", help="test command (overrides the spec's)")
    p.add_argument("--skip", action="append", choices=("build", "test"), default=[],
                   help="skip the build or the tests (repeatable), as execute does")
    p.add_argument("--image", help="sandbox image (overrides the spec's)")
    _sandbox_option(p)
    p.add_argument("--timeout", type=positive_float, metavar="S",
                   help="per-command timeout in seconds (the only way above the default 600)")
    _limit_options(p)
    _cache_options(p, "verify")
    p.add_argument("--json", action="store_true",
                   help="one JSON event per commit, then a summary, on stdout")
    p.add_argument("--format", choices=("table", "github"), default="table",
                   help="`github`: the table, then a GitHub Actions error annotation for each "
                   "failing commit (the run's own output is never read as a workflow command)")
    p.add_argument("--junit", metavar="FILE",
                   help="also write a JUnit XML report: one test case per commit")
    _summary_option(p)
    p.add_argument("--shard", type=shard_option, metavar="K/N",
                   help="verify only job K's share of N (a CI matrix): the range's distinct "
                   "trees in order, round robin; N jobs cover each tree once (docs/scaling.md)")
    p.set_defaults(command="verify")


def _plan(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "plan", help="draft a history spec from the messy branch (or --check one)",
        description="Draft a history spec: group the branch's changes into logical commits, "
        "ordered so each builds, from how files changed together (a model, if configured, "
        "refines it through the sandboxed read-only file tools). --check SPEC says what a "
        "spec's paths leave uncovered or cover twice (exit 4).")
    p.add_argument("--source", metavar="BRANCH", help="the messy branch (default: the current "
                   "branch)")
    p.add_argument("--remote", metavar="BRANCH", help="what it merges into (default: of its "
                   "upstream, main and master, and their copies on the upstream's remote and "
                   "origin, the one sharing the most history)")
    p.add_argument("--cleaned", metavar="BRANCH", help="the clean branch (default: "
                   "<source>-clean)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: "
                   "standard output)")
    p.add_argument("--force", action="store_true", help="replace an existing -o FILE")
    p.add_argument("--check", metavar="SPEC", help="check SPEC's coverage instead of planning")
    _repo_option(p)
    _model_options(p)
    p.add_argument("--sandbox", choices=("docker", "local"), default="docker",
                   help="where the model's file tools run; `local` isolates nothing (for tests "
                   "only)")
    p.add_argument("--engine", action="append", metavar="HOST|CONTEXT", default=[],
                   help="the Docker engine to use (default: DOCKER_HOST, else the current "
                   "context)")
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.set_defaults(command="plan")


def _report(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "report", help="write an HTML report of a reconstruction or a verified range",
        description="Write one self-contained HTML file (no script, nothing loaded from a "
        "network) of what is recorded: for SPEC, the clean commits beside the messy branch, "
        "each with its diff stat, build and test results, fixes, provenance warnings and "
        "tokens, where the last run's time went, and the verify table; for --range, that "
        "range's commits and results. Nothing is built or run.")
    p.add_argument("spec", nargs="?", metavar="SPEC", help="the history spec (TOML)")
    p.add_argument("--range", metavar="REV-RANGE", help="report on this revision range "
                   "(main..feature) instead of a spec's branches")
    p.add_argument("--spec", dest="spec_file", metavar="FILE", help="with --range: prefer "
                   "results recorded under this spec's build and test commands")
    p.add_argument("--build", metavar="CMD", help="prefer results recorded with this build "
                   "command")
    p.add_argument("--test", metavar="CMD", help="prefer results recorded with this test "
                   "command")
    p.add_argument("-o", "--output", metavar="FILE", required=True,
                   help="the HTML file to write (never through a symbolic link)")
    p.add_argument("--force", action="store_true", help="replace an existing -o FILE")
    _repo_option(p)
    p.add_argument("--json", action="store_true", help="one JSON event on stdout")
    p.set_defaults(command="report")


def _status(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("status", help="show each commit's state",
                       description="Show each commit's state, from the spec alone.")
    p.add_argument("spec", metavar="SPEC", help="the history spec (TOML)")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.set_defaults(command="status")


def _simple(sub: argparse._SubParsersAction[_Parser], name: str, text: str) -> _Parser:
    p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
    p.set_defaults(command=name)
    return p


def _clean(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _simple(sub, "clean", "remove sandbox containers of runs that are no longer alive, and "
                "the unnamed images of their killed setups")
    p.add_argument("specs", metavar="SPEC", nargs="*",
                   help="only the containers and images of runs on these specs")
    p.add_argument("--all", action="store_true",
                   help="also remove the containers of runs still in progress, and of runs on "
                   "other hosts sharing this engine")
    p.add_argument("--json", action="store_true", help="one JSON summary event on stdout")


def _demo(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _simple(sub, "demo", "build a messy demo repository and reconstruct it in the sandbox")
    p.add_argument("--directory", metavar="DIR", help="where to create the demo repository")
    p.add_argument("--llm", action="store_true", help="use hints and a model instead of paths")
    p.add_argument("--json", action="store_true",
                   help="the run's JSON events, then a `demo` event, on stdout")
    _model_options(p)
    _sandbox_option(p)


def _images(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("images", help="build, list and prune the sandbox images",
                       description="The sandbox images, tagged by the content of their inputs.")
    images = p.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    images.required = True
    build = images.add_parser("build", help="build the images (bootstrapping a base offline "
                              "when no registry answers)")
    names = build.add_argument("names", nargs="*", metavar="NAME",
                               help="images to build (default: all): " + ", ".join(IMAGE_NAMES))
    names.completions = IMAGE_NAMES  # type: ignore[attr-defined]  # see commands/completion
    bootstrap = images.add_parser("bootstrap", help="make a Debian base with debootstrap and "
                                  "docker import")
    listing = images.add_parser("list", help="list the images and whether each is current")
    prune = images.add_parser("prune", help="remove images built from older inputs, and "
                              "prepared environments whose base image is gone or stale")
    prune.add_argument("--environments", action="store_true",
                       help="also remove every prepared environment ([sandbox] setup prepares "
                       "them again when needed)")
    tag = images.add_parser("tag", help="print an image's current tag (for compose.yaml: "
                            "RETCON_SANDBOX_BASE_IMAGE)")
    name = tag.add_argument("name", metavar="NAME", help="base, node or rust")
    name.completions = IMAGE_NAMES  # type: ignore[attr-defined]
    export = images.add_parser("export", help="write this repository's prepared environments "
                               "(and their base images) to FILE, for a CI cache; authenticated "
                               "with your notes key")
    load = images.add_parser("import", help="load the environments `export` wrote to FILE, "
                             "once FILE verifies under your notes key and names this "
                             "repository")
    for action in (export, load):
        action.add_argument("file", metavar="FILE", help="the export's file")
        action.add_argument("--repo", metavar="DIR",
                            help="the repository (default: the current directory's)")
    for action in (build, bootstrap, listing, prune, tag):
        action.add_argument("--json", action="store_true",
                            help="one JSON event per image on stdout")
    for action in (export, load):
        action.add_argument("--json", action="store_true",
                            help="one JSON event on stdout, naming the file's environments "
                            "and base images")
    p.set_defaults(command="images")


def _completion(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)",
                       description="Print a completion script for SHELL. Load it from your "
                       f"shell's startup file: eval \"$({PROG} completion bash)\" in ~/.bashrc, "
                       f"eval \"$({PROG} completion zsh)\" after compinit in ~/.zshrc, or "
                       f"{PROG} completion fish | source in ~/.config/fish/config.fish.")
    p.add_argument("shell", metavar="SHELL", choices=("bash", "zsh", "fish"),
                   help="bash, zsh or fish")
    p.set_defaults(command="completion", build_parser=parser)


def _man(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser("man", help="print the man page (roff), generated from these parsers",
                       description="Print the man page, generated from the command line's own "
                       f"parsers. Read it with `{PROG} man | man -l -`, or install it: "
                       f"`{PROG} man > ~/.local/share/man/man1/{PROG}.1`.")
    p.set_defaults(command="man", build_parser=parser)


def parser() -> _Parser:
    top = _Parser(prog=PROG, description="Reconstruct a messy branch into clean, logical "
                  "commits. Every build, test and LLM file tool runs in an offline Docker "
                  "container.")
    top.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _execute(sub)
    _verify(sub)
    _plan(sub)
    _report(sub)
    _status(sub)
    _simple(sub, "prompt", "print guidance for writing a spec, for a person or an agent")
    _clean(sub)
    _demo(sub)
    _images(sub)
    _completion(sub)
    _man(sub)
    _simple(sub, "version", "print the version")
    _version_everywhere(top)
    _verbosity(top)
    return top


def _verbosity(parser: argparse.ArgumentParser, top: bool = True) -> None:
    """-q/--quiet and -v/--verbose, before or after the command."""
    group = parser.add_mutually_exclusive_group()
    default = 0 if top else argparse.SUPPRESS
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                       default=default, help="print only warnings, failures and the outcome")
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                       default=default, help="also print the events only --json shows")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _verbosity(child, top=False)


def _version_everywhere(parser: argparse.ArgumentParser) -> None:
    """`--version` works on every command and subcommand, as `-h` does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.add_argument("--version", action="version", version=f"{PROG} {__version__}",
                                   help="print the version and exit")
                _version_everywhere(child)


# --- running --------------------------------------------------------------------------------


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(f"{PROG} {__version__}")
        return 0
    module = importlib.import_module(f"retcon_sandbox.commands.{args.command}")
    command: Callable[[argparse.Namespace], int] = module.run
    gc.freeze()  # what the imports made lives to the end: no collection walks it again
    return command(args)


def main(argv: Sequence[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)  # a closed terminal: stop as for Ctrl-C
    encode_anything()
    real_stdout = sys.stdout
    sys.stdout = cast(TextIO, Stdout(real_stdout))
    try:
        code = _main(argv)
    finally:
        sys.stdout = real_stdout
    gc.freeze()  # the interpreter's exit then walks none of it (0.1 s and more of CPU)
    sys.exit(code)


def _main(argv: Sequence[str] | None) -> int:
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)  # until parsed
    command = None
    try:
        args = parser().parse_args(argv)
        as_json = bool(getattr(args, "json", False))
        command = args.command
        set_verbosity(args.verbosity)
        code = _run(args)
        sys.stdout.flush()
    except RetconError as exc:
        report_error(exc, as_json)
        code = exc.exit_code
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            report_error(Interrupted("every finished step is saved in the spec; rerun the "
                                     "same command to resume."), as_json)
        code = EXIT_INTERRUPTED
    except StdoutClosed:  # like `git log | head -1`: stop quietly
        discard_stdout()
        if command in ("execute", "demo"):
            sys.stderr.write("\n✗ stopped: standard output was closed; every finished step is "
                             "saved in the spec, rerun the same command to resume.\n")
        code = EXIT_ERROR
    except SystemExit:
        raise
    except Exception as exc:  # a bug of ours: say so, keep the traceback in a file
        report_error(internal_error(exc, versions), as_json)
        code = EXIT_ERROR
    return code


def versions() -> str:
    """What a bug report needs, at the top of a crash log: ours, Python's, the platform's, git's
    and the Docker engine's (asked with a short timeout)."""
    from retcon_sandbox.backends.docker.engine import engine_version
    from retcon_sandbox.repo.gitrepo import git_version

    return (f"retcon-sandbox {__version__}\n"
            f"Python {platform.python_version()} ({platform.python_implementation()})\n"
            f"platform {platform.platform()}\n"
            f"{git_version()}\n"
            f"Docker engine {engine_version()}\n")
