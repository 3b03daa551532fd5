"""`retcon-sandbox images build|bootstrap|list|prune`."""

from __future__ import annotations

import argparse
import sys

from retcon_sandbox.backends import images
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.errors import EXIT_OK, UsageError
from retcon_sandbox.text import sanitize


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


def run(args: argparse.Namespace) -> int:
    engine = DockerEngine()
    if args.action == "build":
        unknown = [n for n in args.names if n not in images.CATALOG]
        if unknown:
            raise UsageError(f"no image named {', '.join(map(repr, unknown))}",
                             "Known: " + ", ".join(images.CATALOG))
        for name in args.names or list(images.CATALOG):
            tag = images.ensure(engine, images.CATALOG[name].tag, _say)
            print(f"Built {tag}")
    elif args.action == "bootstrap":
        tag = images.bootstrap(engine, _say)
        print(f"Bootstrapped {tag}; `retcon-sandbox images build` now builds offline.")
    elif args.action == "list":
        for row in images.listing(engine):
            print(sanitize(f"  {row.name:<6} {row.tag:<36} {row.state}"))
    else:
        removed = images.prune(engine, _say, environments=args.environments)
        print(f"Removed {len(removed)} stale image(s)." if removed else "No stale images.")
    return EXIT_OK
