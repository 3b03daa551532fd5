"""`retcon-sandbox report SPEC -o report.html` (or `report --range A..B -o report.html`): one
self-contained HTML page of a reconstruction or a verified range, for a person to look at.

Nothing runs: the page is made from what runs left (the spec's history, the branches, the
verification notes, the transcript and the run's events; see summary/facts.py). The output is
checked before anything is read and written whole, never through a symbolic link
(outfile.py); without --force an existing file is kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retcon_sandbox.commands.options import find_repo
from retcon_sandbox.commands.verify import revision_range
from retcon_sandbox.errors import EXIT_OK, GitError, RetconError, UsageError
from retcon_sandbox.outfile import OutFile
from retcon_sandbox.report import make_reporter
from retcon_sandbox.spec.file import Spec, SpecFile
from retcon_sandbox.summary.facts import Facts, for_range, for_spec
from retcon_sandbox.summary.html import page
from retcon_sandbox.text import sanitize
from retcon_sandbox.verify.table import RangeTarget, parse_target


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    target = OutFile(output, "-o", "report", "an HTML report", replace=args.force,
                     exists_hint="Give --force to replace it, or another -o FILE.")
    target.check()
    spec_path = args.spec_file or args.spec
    if args.spec_file and args.spec and args.spec_file != args.spec:
        raise UsageError(f"two specs given: {args.spec} and --spec {args.spec_file}")
    if spec_path is None and args.range is None:
        raise UsageError("report needs a spec or a revision range",
                         "For example: retcon-sandbox report history-spec.toml -o report.html, "
                         "or retcon-sandbox report --range main..feature -o report.html.")
    facts = gather(args, Path(spec_path) if spec_path else None)
    try:
        target.write(page(facts).encode("utf-8"))
    except OSError as exc:
        raise RetconError(f"the report {output} was not written: {exc.strerror or exc}",
                          "Free space or fix the directory, then rerun (nothing runs again: "
                          "the report is made from what is recorded).") from None
    verified = sum(1 for c in (*facts.clean, *facts.messy) if c.outcome is not None)
    reporter = make_reporter(args.json)
    reporter.emit("report_written", path=str(output), commits=len(facts.clean),
                  messy=len(facts.messy), verified=verified)
    if not args.json:
        print(sanitize(f"Report written: {output} ({len(facts.clean)} commit(s)"
                       + (f" beside {len(facts.messy)} messy one(s)" if facts.messy else "")
                       + f"; {verified} with a recorded result)"))
    return EXIT_OK


def gather(args: argparse.Namespace, spec_path: Path | None) -> Facts:
    spec: Spec | None = None
    specfile = SpecFile(spec_path) if spec_path else None
    if specfile is not None:
        spec = specfile.load()
    repo = find_repo(Path(args.repo) if args.repo else None,
                     specfile.real if specfile else None)
    build = args.build if args.build is not None else spec.sandbox.build if spec else None
    test = args.test if args.test is not None else spec.sandbox.test if spec else None
    if args.range is not None:
        target = parse_target(args.range, None, False)
        assert isinstance(target, RangeTarget)
        label, rows = revision_range(repo, target)
        if not rows:
            raise GitError(f"no commits in {label}",
                           "BASE..TIP names the commits reachable from TIP and not from BASE.")
        wanted = (build, test) if build or test else None
        return for_range(repo, label, rows, wanted)
    assert spec is not None and specfile is not None
    return for_spec(repo, spec, specfile.real, (build, test))
