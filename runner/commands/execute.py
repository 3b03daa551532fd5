"""`retcon-sandbox execute SPEC`: run or resume the reconstruction loop."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from runner.commands.setup import ModelOptions, make_agent, make_backend, require_model
from runner.engine import Engine, RunOptions
from runner.errors import EXIT_ERROR, EXIT_OK
from runner.gitrepo import Repo
from runner.report import HumanReporter, JsonReporter, Reporter
from runner.spec import CommitSpec, SpecFile


@dataclass(frozen=True)
class ExecuteOptions:
    spec: Path
    build: str | None = None
    test: str | None = None
    skip: frozenset[str] = frozenset()
    model: str | None = None
    base_url: str | None = None
    image: str | None = None
    sandbox: str = "docker"
    squash_wip: bool = False
    non_interactive: bool = False
    json: bool = False
    timeout: float | None = None


def run(options: ExecuteOptions) -> int:
    reporter: Reporter = JsonReporter() if options.json else HumanReporter()
    specfile = SpecFile(options.spec)
    with specfile.locked():
        spec = specfile.load()
        settings = ModelOptions(options.model, options.base_url).settings()
        require_model(spec, settings)
        repo = Repo(spec.path.parent)
        backend = make_backend(options.sandbox, spec, options.image)  # progress on stderr
        reporter.emit("spec", path=str(options.spec), source=spec.source, remote=spec.remote,
                      cleaned=spec.cleaned, sandbox=backend.describe())
        agent = make_agent(settings, spec.path)
        interactive = not options.non_interactive and not options.json and sys.stdin.isatty()
        engine = Engine(specfile, spec, repo, backend, agent, reporter,
                        RunOptions(build=options.build, test=options.test, skip=options.skip,
                                   timeout=options.timeout or spec.sandbox.timeout,
                                   squash_wip=options.squash_wip),
                        ask=ask_note if interactive else None)
        try:
            result = engine.run()
        finally:
            if agent is not None:
                agent.transcript.close()
    return EXIT_OK if result.trees_equal else EXIT_ERROR


def ask_note(commit: CommitSpec, summary: str) -> str | None:
    sys.stdout.write(f"\n  Commit #{commit.number} is stuck: {summary}\n"
                     "  Type a resolution note (recorded as `resolved` and given to the model), "
                     "or SKIP to stop:\n")
    try:
        answer = input("  > ").strip()
    except EOFError:
        return None
    return None if not answer or answer.upper() == "SKIP" else answer
