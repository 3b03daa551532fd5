"""`retcon-sandbox images build|bootstrap|list|prune|tag|export|import`; `--json` prints one
event per image (or per removal) instead of the lines, with progress on stderr either way."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.errors import EXIT_OK, UsageError
from retcon_sandbox.report import JsonReporter, verbosity
from retcon_sandbox.text import sanitize


def _say(line: str) -> None:
    """Progress on stderr; --quiet keeps only the outcome (and errors)."""
    if verbosity() >= 0:
        sys.stderr.write(line + "\n")


def _known(names: list[str]) -> None:
    unknown = [n for n in names if n not in sandboximages.CATALOG]
    if unknown:
        raise UsageError(f"no image named {', '.join(map(repr, unknown))}",
                         "Known: " + ", ".join(sandboximages.CATALOG))


def run(args: argparse.Namespace) -> int:
    as_json = bool(getattr(args, "json", False))
    reporter = JsonReporter() if as_json else None
    if args.action == "tag":  # no engine needed: the tag is the digest of the inputs
        _known([args.name])
        tag = sandboximages.CATALOG[args.name].tag
        if reporter:
            reporter.emit("image", name=args.name, tag=tag)
        else:
            print(tag)
        return EXIT_OK
    if args.action in ("export", "import"):
        return transfer(args, reporter)
    engine = DockerEngine()
    if args.action == "build":
        _known(args.names)
        for name in args.names or list(sandboximages.CATALOG):
            tag = sandboximages.ensure(engine, sandboximages.CATALOG[name].tag, _say)
            if reporter:
                reporter.emit("image_built", name=name, tag=tag)
            else:
                print(f"Built {tag}")
        if not reporter and (not args.names or "base" in args.names) and verbosity() >= 0:
            print("  compose.yaml builds on it with: export RETCON_SANDBOX_BASE_IMAGE="
                  + sandboximages.CATALOG["base"].tag)
    elif args.action == "bootstrap":
        tag = sandboximages.bootstrap(engine, _say)
        if reporter:
            reporter.emit("image_bootstrapped", tag=tag)
        else:
            print(f"Bootstrapped {tag}; `retcon-sandbox images build` now builds offline.")
    elif args.action == "list":
        for row in sandboximages.listing(engine):
            if reporter:
                reporter.emit("image", name=row.name, tag=row.tag, state=row.state)
            else:
                print(sanitize(f"  {row.name:<6} {row.tag:<36} {row.state}"))
    else:
        removed = sandboximages.prune(engine, _say, environments=args.environments)
        if reporter:
            reporter.emit("images_pruned", removed=removed)
        else:
            print(f"Removed {len(removed)} stale image(s)." if removed else "No stale images.")
    return EXIT_OK


def transfer(args: argparse.Namespace, reporter: JsonReporter | None) -> int:
    """`export FILE` (FILE checked before the engine is asked anything) or `import FILE`."""
    from retcon_sandbox.backends.docker import envtransfer
    from retcon_sandbox.commands.options import find_repo

    repo = find_repo(Path(args.repo) if args.repo else None, None)
    path = Path(args.file)
    if args.action == "export":
        envtransfer.output(path).check()
        moved = envtransfer.export(DockerEngine(), repo, path)
        verb = "Exported"
    else:
        moved = envtransfer.load(DockerEngine(), repo, path)
        verb = "Imported"
    if reporter and args.action == "export":
        reporter.emit("environments_exported", file=str(path),
                      environments=moved.environments, bases=moved.bases)
    elif reporter:
        reporter.emit("environments_imported", file=str(path),
                      environments=moved.environments, bases=moved.bases)
    else:
        print(sanitize(f"{verb} {len(moved.environments)} prepared environment(s) and "
                       f"{len(moved.bases)} base image(s) ({path})."))
    return EXIT_OK
