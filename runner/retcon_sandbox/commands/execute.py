"""`retcon-sandbox execute SPEC`: run or resume the reconstruction loop.

Everything that can be checked is checked before anything is written: the spec, the repository
and its branches, the model (one preflight request), the sandbox. Only then is the cleaned
branch created and the first entry appended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from retcon_sandbox import outfile
from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.environments import Environments, check_inputs
from retcon_sandbox.commands.options import (
    ModelOptions,
    check_base_url,
    default_pipeline,
    engine_in_use,
    find_repo,
    limit_options,
    make_agent,
    make_backend,
    require_model,
    sandbox_settings,
)
from retcon_sandbox.errors import EXIT_ERROR, RetconError
from retcon_sandbox.model.settings import ModelSettings
from retcon_sandbox.model.settings import prefetch as prefetch_model
from retcon_sandbox.pipeline import Pipeline
from retcon_sandbox.reconstruct import driver
from retcon_sandbox.reconstruct.context import Held, Run, RunOptions
from retcon_sandbox.reconstruct.steps.commit import blocked_error
from retcon_sandbox.repo import checks
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import Reporter, make_reporter, watching
from retcon_sandbox.spec.file import CommitSpec, Spec, SpecFile
from retcon_sandbox.spec.history import PROVENANCE_PREFIX, Blocked, Done, next_step
from retcon_sandbox.spec.settings import SandboxSettings
from retcon_sandbox.spec.statedir import StateDir
from retcon_sandbox.summary.facts import for_spec
from retcon_sandbox.summary.markdown import run_summary
from retcon_sandbox.summary.runlog import RunLog
from retcon_sandbox.text import sanitize
from retcon_sandbox.threads import later
from retcon_sandbox.verify.cache import Cache
from retcon_sandbox.verify.pool import default_jobs
from retcon_sandbox.verify.stages import Commands, Verifier

if TYPE_CHECKING:  # openai loads only when a model is named, in the model's thread
    from retcon_sandbox.model.agent import Agent


@dataclass(frozen=True)
class ExecuteOptions:
    spec: Path
    repo: Path | None = None
    build: str | None = None
    test: str | None = None
    skip: frozenset[str] = frozenset()
    model: str | None = None
    base_url: str | None = None
    model_timeout: float | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    image: str | None = None
    sandbox: str = "docker"
    engine: tuple[str, ...] = ()  # --engine: one at most (see make_backend)
    squash_wip: bool = False
    non_interactive: bool = False
    json: bool = False
    timeout: float | None = None
    no_cache: bool = False
    jobs: int | None = None
    reuse: bool = True  # --no-reuse: a new container for every tree the squash check runs
    pass_env: tuple[str, ...] = ()
    allow_pull: bool = False
    strict_provenance: bool = False
    accept_provenance: bool = False
    adopt_branch: bool = False
    base_check: bool = True
    setup_network: str = "registries"
    setup_registry: tuple[str, ...] = ()
    setup_allow_address: tuple[str, ...] = ()
    setup_disk: int = hostaccess.SETUP_DISK
    keep_environments: int = hostaccess.KEEP_ENVIRONMENTS
    package_cache: bool = True
    limits: tuple[tuple[str, object], ...] = ()  # --memory, --cpus, ... (see limit_options)
    trust_notes: bool = False
    pipeline: Pipeline | None = None  # see RunOptions.pipeline; None: `default_pipeline`
    summary: Path | None = None  # --summary FILE: the Markdown job summary, appended

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExecuteOptions:
        return cls(spec=Path(args.spec), repo=Path(args.repo) if args.repo else None,
                   build=args.build, test=args.test, skip=frozenset(args.skip),
                   model=args.model, base_url=args.base_url, model_timeout=args.model_timeout,
                   temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                   image=args.image, sandbox=args.sandbox, engine=tuple(args.engine or ()),
                   squash_wip=args.squash_wip,
                   non_interactive=args.non_interactive, json=args.json, timeout=args.timeout,
                   no_cache=args.no_cache, jobs=args.jobs, reuse=not args.no_reuse,
                   pass_env=tuple(args.pass_env or ()), allow_pull=args.allow_pull,
                   strict_provenance=args.strict_provenance,
                   accept_provenance=args.accept_provenance, adopt_branch=args.adopt_branch,
                   base_check=not args.no_base_check, setup_network=args.setup_network,
                   setup_registry=tuple(args.setup_registry or ()),
                   setup_allow_address=tuple(args.setup_allow_address or ()),
                   setup_disk=args.setup_disk, keep_environments=args.keep_environments,
                   package_cache=not args.no_package_cache,
                   limits=tuple(limit_options(args).items()), trust_notes=args.trust_notes,
                   pipeline=args.pipeline,
                   summary=Path(args.summary) if args.summary else None)


def run(args: argparse.Namespace) -> int:
    return execute(ExecuteOptions.from_args(args))


def execute(options: ExecuteOptions) -> int:
    reporter: Reporter = make_reporter(options.json)
    with watching(reporter, None if options.json else sys.stdout):
        return _execute(options, reporter)


def _execute(options: ExecuteOptions, reporter: Reporter) -> int:
    if options.sandbox == "docker":
        from retcon_sandbox.backends.docker.engine import prefetch

        prefetch()  # while the spec and the repository are checked
    check_base_url(options.base_url)
    if options.summary is not None:
        outfile.summary(options.summary, "execute").check()
    access = hostaccess.from_command_line(list(options.pass_env), options.allow_pull,
                                          options.setup_network, list(options.setup_registry),
                                          options.setup_disk, options.keep_environments,
                                          options.package_cache,
                                          list(options.setup_allow_address))
    specfile = SpecFile(options.spec)
    spec = specfile.load()
    if options.model or os.environ.get("RETCON_SANDBOX_MODEL") or spec.model.name:
        prefetch_model()  # while the spec, the repository and the engine are checked
    repo = find_repo(options.repo, specfile.real)
    state_dir = StateDir(repo.common_dir())
    with specfile.locked(state_dir.lock_path(specfile.real)), \
            recorded(reporter, state_dir, specfile, options.summary) as (reporter, started):
        spec = specfile.load()
        specfile.check_appendable()
        specfile.check_writable()
        revs, tip = check_spec(repo, spec)
        model = ModelOptions(options.model, options.base_url, options.model_timeout,
                             options.temperature, options.max_tokens, options.seed
                             ).settings(spec.model) \
            if needs_model(repo, spec, tip, revs.source) else None
        require_model(spec, model)
        interactive = not options.non_interactive and not options.json and sys.stdin.isatty()
        stop_if_blocked(spec, interactive, reporter, options.accept_provenance)
        settings = sandbox_settings(spec, options.image, options.build, options.test,
                                    options.timeout, reporter, dict(options.limits))
        backend = make_backend(options.sandbox, spec, settings, access,
                               spec.sandbox.image if options.image is None else None, repo,
                               options.engine)
        transcript = state_dir.transcript_path(specfile.real)
        agent = model_ahead(model, transcript, reporter)
        reporter.emit("spec", path=str(options.spec), source=spec.source, remote=spec.remote,
                      cleaned=spec.cleaned, sandbox=backend.describe(),
                      engine=engine_in_use(options.sandbox, options.engine),
                      transcript=str(transcript) if model else None)
        envs = Environments(repo, backend, settings, access.setup, reporter, revs.source,
                            fresh=options.no_cache)
        cache = Cache(repo, read=not options.no_cache, trust=options.trust_notes)
        cache.check()
        environment = backend.environment() + envs.describe()
        verifier, final = verifiers(settings, options.skip, reporter, cache, environment, envs)
        ctx = Run(specfile, spec, repo, backend, verifier, None, reporter,
                  run_options(options), settings, envs,
                  ask=ask_note if interactive else None,
                  source=revs.source, base=revs.base, final=final, state=state_dir,
                  pending_agent=agent)
        started.append(ctx)
        try:
            result = driver.run(ctx)
        except RetconError as exc:
            if exc.exit_code == EXIT_ERROR:
                exc.hint = f"{exc.hint}\n{ctx.what_was_recorded()}".lstrip("\n")
            raise
        finally:
            envs.settle()  # what setups left to close, behind the run's back
            if ctx.agent is not None:
                ctx.agent.transcript.close()
            if verifier.cache is not None and verifier.cache.problem:
                reporter.emit("warning", message="build and test results were not cached: "
                              + verifier.cache.problem)
    return result.exit_code


def model_ahead(model: ModelSettings | None, transcript: Path, reporter: Reporter
                ) -> Callable[[], Agent | None]:
    """The model, made and checked by one request (`make_agent`: about a second to import
    openai, then the endpoint's answer) in a thread, while the run's other checks go on and its
    first sandbox opens. The callable returned waits for it (`Run.model_ready`: the driver asks
    before anything is written) and only then shows its events."""
    if model is None:
        return lambda: None
    held = Held(reporter)
    pending = later(lambda: make_agent(model, transcript, held), "retcon-model")

    def ready() -> Agent | None:
        try:
            return pending()
        finally:
            held.release()

    return ready


@contextlib.contextmanager
def recorded(reporter: Reporter, state_dir: StateDir, specfile: SpecFile,
             summary: Path | None) -> Iterator[tuple[RunLog, list[Run]]]:
    """The run's events kept for `report` (summary/runlog.py); once the run has begun (its
    context is put in the list), the job summary is appended to `summary` however it ends."""
    log = RunLog(reporter, state_dir.events_path(specfile.real))
    started: list[Run] = []
    try:
        yield log, started
    finally:
        log.close()
        if summary is not None and started:
            write_summary(started[0], log, summary)


def write_summary(ctx: Run, log: RunLog, summary: Path) -> None:
    """Append the run's Markdown summary; a summary that cannot be made or written is a
    warning (the run's outcome stands)."""
    commands = ctx.verifier.commands
    try:
        facts = for_spec(ctx.repo, ctx.spec, ctx.specfile.real,
                         (commands.planned("build"), commands.planned("test")), log.events)
        problem = outfile.summary(summary, "execute").append(run_summary(facts))
    except RetconError as exc:
        problem = f"{summary} was not written: {exc.message}"
    if problem:
        log.inner.emit("warning", message=f"the summary {problem}")


def check_spec(repo: Repo, spec: Spec) -> tuple[checks.Revisions, str]:
    """The spec against the repository, before anything is written: its branches, the commits
    its history records, the source's file names, its patterns and the setup's inputs. Returns
    the revisions and the cleaned branch's tip (the merge-base before the first commit)."""
    revs = checks.revisions(repo, spec)
    checks.recorded_commits(repo, spec)
    checks.source_files(repo, revs, spec.sandbox.max_file_size)
    tip = repo.branch_sha(spec.cleaned) or revs.base
    checks.path_patterns(repo, spec, tip, revs.source)
    checks.versions(repo, spec, revs.source, revs.base)
    check_inputs(repo, spec.sandbox, [revs.base, revs.source], f"{spec.remote} or {spec.source}")
    return revs, tip


def verifiers(settings: SandboxSettings, skip: frozenset[str], reporter: Reporter, cache: Cache,
              environment: str, envs: Environments) -> tuple[Verifier, Verifier | None]:
    """Each commit's verifier (`test`), and the finished branch's (`test_final`) when the spec
    has one and tests are not skipped."""
    def verifier(test: str | None) -> Verifier:
        return Verifier(Commands(settings.build, test, settings.timeout, skip), reporter, cache,
                        environment, envs.prepared_id)
    final = verifier(settings.test_final) \
        if settings.test_final and "test" not in skip else None
    return verifier(settings.test), final


def run_options(options: ExecuteOptions) -> RunOptions:
    return RunOptions(squash_wip=options.squash_wip, jobs=options.jobs or default_jobs(),
                      reuse=options.reuse, strict_provenance=options.strict_provenance,
                      accept_provenance=options.accept_provenance,
                      adopt_branch=options.adopt_branch, base_check=options.base_check,
                      pipeline=options.pipeline or default_pipeline(options.sandbox,
                                                                    options.engine))


def needs_model(repo: Repo, spec: Spec, tip: str, source: str) -> bool:
    """Whether this run can ask a model anything: a commit still to do, or a remainder to
    assign. A rerun of a complete run (to squash, say) needs none: no key, no request."""
    if any(not isinstance(next_step(c.history), Done) for c in spec.commits):
        return True
    return repo.tree_of(tip) != repo.tree_of(source)


def stop_if_blocked(spec: Spec, interactive: bool, reporter: Reporter,
                    accept_provenance: bool = False) -> None:
    """The first commit to work on is stuck and nobody can be asked: stop before anything."""
    for commit in spec.commits:
        step = next_step(commit.history)
        if isinstance(step, Done):
            continue
        released = accept_provenance and isinstance(step, Blocked) and \
            step.summary.startswith(PROVENANCE_PREFIX)
        if isinstance(step, Blocked) and not interactive and not released:
            reporter.emit("resume", number=commit.number, total=len(spec.commits),
                          subject=commit.subject)
            raise blocked_error(spec.path.name, commit, step.summary, previously=True,
                                cleaned=spec.cleaned)
        return


def ask_note(commit: CommitSpec, summary: str) -> str | None:
    """A resolution note typed at the terminal. The summary (the model's words) is shown
    sanitised; what is typed is read whatever its bytes (a terminal that is not UTF-8 gives
    surrogates, which the spec records as U+FFFD)."""
    sys.stdout.write(f"\n  Commit #{commit.number} is stuck: {sanitize(summary)}\n"
                     "  Type a resolution note (recorded as `resolved` and given to the model), "
                     "or SKIP to stop:\n")
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stdin.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
    try:
        answer = input("  > ").strip()
    except EOFError:
        return None
    return None if not answer or answer.upper() == "SKIP" else answer
