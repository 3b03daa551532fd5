"""`retcon-sandbox verify [SPEC | REV-RANGE] [-j N]`: build and test every commit of a range, each
in a sandbox as new (see verify/pool.py), N at a time, through the verification cache.

The range is the spec's cleaned branch from the merge-base of its source and remote, or a
revision range (`main..feature`) with commands from `--build`/`--test` or `--spec FILE`. Exit
code 0 when every commit passes, 3 when one fails (a human is needed, as for a stuck commit), 1
for a configuration error. Nothing is written but the cache's notes.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from retcon_sandbox import outfile, progress
from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.environments import Environments, check_inputs
from retcon_sandbox.commands.options import (
    engine_in_use,
    find_repo,
    limit_options,
    make_backends,
    sandbox_settings,
    setting_refused,
)
from retcon_sandbox.errors import EXIT_OK, EXIT_STUCK, ConfigError, GitError, UsageError
from retcon_sandbox.outfile import OutFile
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import (
    HumanReporter,
    JsonReporter,
    Reporter,
    plain_terminal,
    verbosity,
    watching,
)
from retcon_sandbox.spec.file import Spec, SpecFile
from retcon_sandbox.spec.settings import DEFAULTS, SandboxSettings, SettingError, final_test
from retcon_sandbox.spec.statedir import StateDir
from retcon_sandbox.text import sanitize
from retcon_sandbox.verify.cache import REF, Cache, Outcome
from retcon_sandbox.verify.ci import Outputs
from retcon_sandbox.verify.pool import Item, Pool, default_jobs
from retcon_sandbox.verify.shard import Shard, distinct_trees
from retcon_sandbox.verify.stages import Commands, Verifier
from retcon_sandbox.verify.table import (
    RangeTarget,
    Row,
    SpecTarget,
    claimed,
    claims,
    failures,
    header,
    parse_target,
    render_row,
    summary,
    totals,
)


@dataclass(frozen=True)
class Plan:
    repo: Repo
    spec: Spec | None
    settings: SandboxSettings
    label: str  # the range, as the user reads it
    rows: list[Row]  # this shard's (all of the range without --shard)
    trees: int = 0  # distinct trees in the whole range
    shard: Shard | None = None

    @property
    def shard_line(self) -> str:
        """`Shard 2/3: 4 of 11 trees`, or "" without --shard."""
        return self.shard.line(distinct_trees(self.rows), self.trees) if self.shard else ""


def run(args: argparse.Namespace) -> int:
    outputs = ci_outputs(args)
    with outputs.guard(sys.stdout):
        return verify(args, outputs)


def ci_outputs(args: argparse.Namespace) -> Outputs:
    """--junit FILE, --summary FILE and --format github, checked before anything runs."""
    github = args.format == "github"
    if github and args.json:
        raise UsageError("--format github and --json both write to standard output",
                         "Choose one; --junit FILE works with either.")
    junit = OutFile(Path(args.junit), "--junit", "verify", "a JUnit report") \
        if args.junit else None
    if junit is not None:
        junit.check()  # never through a link; its folder takes a file (not /proc)
    summary = outfile.summary(Path(args.summary), "verify") if args.summary else None
    if summary is not None:
        summary.check()
    return Outputs(junit, github, summary)


def verify(args: argparse.Namespace, outputs: Outputs) -> int:
    started = time.monotonic()
    reporter: Reporter = JsonReporter() if args.json else HumanReporter()
    access = hostaccess.from_command_line(args.pass_env, args.allow_pull, args.setup_network,
                                          args.setup_registry, args.setup_disk,
                                          args.keep_environments,
                                          not args.no_package_cache, args.setup_allow_address)
    plan = make_plan(args, reporter)
    settings = plan.settings
    if plan.rows:
        check_inputs(plan.repo, settings, [plan.rows[0].sha, plan.rows[-1].sha], plan.label)
    commands = verify_commands(args, settings)
    cache = Cache(plan.repo, read=not args.no_cache, trust=args.trust_notes)
    cache.check()
    envs, more = environments(args, plan, access, reporter)
    backend = envs.backend
    environment = backend.environment() + envs.describe()
    verifier = Verifier(commands, reporter, cache, environment, envs.prepared_id)
    jobs = args.jobs or default_jobs()
    engine = engine_in_use(args.sandbox, tuple(args.engine or ()))
    reporter.emit("verify_start", range=plan.label, commits=len(plan.rows), jobs=jobs,
                  sandbox=backend.describe(), engine=engine, environment=environment, cache=REF,
                  no_cache=bool(args.no_cache), trust_notes=bool(args.trust_notes),
                  skip=sorted(commands.skip), build=commands.planned("build"),
                  test=commands.planned("test"), shard=shard_event(plan))
    display = make_display(args.json, reporter, plan, commands)
    if not args.json and not display.quiet:
        print(sanitize(f"Verifying {plan.label}: {len(plan.rows)} commit(s), {jobs} at a time\n"
                       + (f"  {plan.shard_line}\n" if plan.shard else "")
                       + f"  Sandbox: {backend.describe()}\n" + where_and_how(
                           engine, commands_line(commands, settings, args.test),
                           f"{REF} ({cache_mode(args)}; environment {environment})")),
              flush=True)
    display.begin()
    # a live table shows each tree's phase itself; otherwise the heartbeat's lines do
    with contextlib.nullcontext() if isinstance(display, LiveDisplay) else \
            watching(reporter, None if args.json else sys.stdout, live=False):
        try:
            pool = run_pool(args, plan, envs, more, verifier, jobs, display,
                            reporter if args.json else None)
        finally:  # what setups left to close, behind the pool's back
            for each in (envs, *more):
                each.settle()
    reporter.emit("verify_phases", jobs=jobs, ahead=pool.ahead, reuse=pool.reuse,
                  prepare="command" if pool.prepare_with_command else "exec",
                  engines=pool.spread,
                  seconds=pool.phases.summary(), counts=pool.phases.counts)
    if verifier.cache is not None and verifier.cache.problem:
        reporter.emit("warning", message="results were not cached: "
                      + verifier.cache.problem)
    seconds = time.monotonic() - started
    code = display.end(seconds)
    unwritten = outputs.finish(plan.label, plan.rows, seconds, display.planned, plan.shard_line,
                               plan.repo.ls_tree)
    if unwritten:
        reporter.emit("warning", message=f"{unwritten}. The exit code is still the "
                      f"verification's own ({code}): the commits were verified, only the "
                      "report is missing; free space or fix the directory and rerun (cached "
                      "results make it fast).")
    return code


def verify_commands(args: argparse.Namespace, settings: SandboxSettings) -> Commands:
    """The build and test each tree gets: at least one of them, or a configuration error."""
    commands = Commands(settings.build, final_test(settings, args.test), settings.timeout,
                        frozenset(args.skip))
    if not (commands.planned("build") or commands.planned("test")):
        raise ConfigError("nothing to verify with: no build or test command"
                          + (" that is not skipped" if args.skip else ""),
                          "Give --build and/or --test, or a spec (--spec FILE) whose [sandbox] "
                          "has them.")
    return commands


def environments(args: argparse.Namespace, plan: Plan, access: hostaccess.HostAccess,
                 reporter: Reporter) -> tuple[Environments, list[Environments]]:
    """The first engine's environments (its backend runs the pool's own sandboxes), and one
    more for each further `--engine`, sharing its git lock."""
    settings = plan.settings
    label = StateDir(plan.repo.common_dir()).root / f"verify-{uuid.uuid4().hex[:12]}"
    holder = replace(plan.spec, path=label) if plan.spec else \
        Spec(label, "", "", "", settings)
    spec_image = plan.spec.sandbox.image if plan.spec and args.image is None else None
    backends = make_backends(args.sandbox, holder, settings, access, spec_image, plan.repo,
                             tuple(args.engine or ()))
    source = plan.spec.source if plan.spec else plan.rows[-1].sha if plan.rows else "HEAD"
    runs = plan.rows[-1].sha if plan.rows else None  # the range's code: its cache (not the spec's)
    envs = Environments(plan.repo, backends[0], settings, access.setup, reporter, source,
                        fresh=bool(args.no_cache), runs=runs)
    more = [Environments(plan.repo, other, settings, access.setup, reporter, source,
                         fresh=bool(args.no_cache), git_lock=envs.git_lock, runs=runs)
            for other in backends[1:]]
    return envs, more


def run_pool(args: argparse.Namespace, plan: Plan, envs: Environments,
             more: list[Environments], verifier: Verifier, jobs: int, display: Display,
             report: Reporter | None = None) -> Pool:
    """Every distinct tree of the range once, `jobs` at a time; each row of a tree shows its
    outcome as it comes. `report`: where the build and tests send their phase events."""
    by_tree: dict[str, list[Row]] = {}
    for row in plan.rows:
        by_tree.setdefault(row.tree, []).append(row)

    def on_start(item: Item) -> None:
        for row in by_tree[item.tree]:
            row.started = time.monotonic()
            row.state = "running"

    def on_done(item: Item, outcome: Outcome) -> None:
        claim = verifier.claims.get(item.tree)
        for row in by_tree[item.tree]:
            row.outcome = outcome
            row.claim = claim
            row.state = "done"
            display.finished(row)

    pool = Pool(plan.repo, envs, verifier, jobs, more, reuse=not args.no_reuse, report=report)
    items = [Item(row.tree, f"verify-{row.sha[:12]}", (row.sha, 0),
                  name=f"#{row.number} {row.sha[:7]}", number=row.number) for row in plan.rows]
    pool.run(items, on_done, on_start, display.tick)
    return pool


def where_and_how(engine: str | None, commands: str, cache: str) -> str:
    """The preamble's engine (when one is named), commands and cache lines."""
    return (f"  Engine: {engine}\n" if engine else "") + f"  Commands: {commands}\n" \
        f"  Cache: {cache}\n"


def shard_event(plan: Plan) -> dict[str, int] | None:
    if plan.shard is None:
        return None
    return {"k": plan.shard.k, "n": plan.shard.n, "trees": distinct_trees(plan.rows),
            "of": plan.trees}


def commands_line(commands: Commands, settings: SandboxSettings, override: str | None) -> str:
    """The build and test commands this run gives every tree, and where the test's came from."""
    test = commands.planned("test")
    origin = " ([sandbox] test_final)" if test and override is None and settings.test_final \
        else ""
    return f"build `{commands.planned('build') or '-'}`, test `{test or '-'}`{origin}"


def cache_mode(args: argparse.Namespace) -> str:
    if args.no_cache:
        return "not read: --no-cache"
    if args.trust_notes:
        return "read, and results claimed by others trusted: --trust-notes"
    return "read; results claimed by others run again"


# --- what to verify ------------------------------------------------------------------------


def make_plan(args: argparse.Namespace, reporter: Reporter) -> Plan:
    target_text: str | None = args.target
    is_spec = target_text is not None and (target_text.endswith(".toml")
                                           or names_a_file(target_text))
    target = parse_target(target_text, args.spec, is_spec)
    spec_path = target.path if isinstance(target, SpecTarget) else args.spec
    spec: Spec | None = None
    specfile = None
    if spec_path:
        specfile = SpecFile(Path(spec_path))
        spec = specfile.load()
    repo = find_repo(Path(args.repo) if args.repo else None,
                     specfile.real if specfile else None)
    if spec is not None:
        settings = sandbox_settings(spec, args.image, args.build, args.test, args.timeout,
                                    reporter, limit_options(args))
    else:
        settings = command_line_settings(args)
    if isinstance(target, SpecTarget):
        assert spec is not None
        label, commits = spec_range(repo, spec)
    else:
        label, commits = revision_range(repo, target)
    if not commits:
        raise GitError(f"no commits to verify in {label}",
                       "BASE..TIP names the commits reachable from TIP and not from BASE.")
    rows = [Row(i, sha, tree, subject) for i, (sha, tree, subject) in enumerate(commits, 1)]
    shard: Shard | None = args.shard
    return Plan(repo, spec, settings, label, shard.select(rows) if shard else rows,
                distinct_trees(rows), shard)


def names_a_file(text: str) -> bool:
    """Whether `text` is the path of an existing file. A revision range is not a path, and
    may be no valid one at all (a name longer than the file system takes)."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # ENAMETOOLONG, EACCES; a NUL byte
        return False


def command_line_settings(args: argparse.Namespace) -> SandboxSettings:
    try:
        return DEFAULTS.replace(image=args.image, build=args.build, test=args.test,
                                timeout=args.timeout, **limit_options(args))
    except SettingError as exc:
        raise setting_refused(exc) from None


def spec_range(repo: Repo, spec: Spec) -> tuple[str, list[tuple[str, str, str]]]:
    source = repo.resolve(spec.source)
    remote = repo.resolve(spec.remote)
    base = repo.merge_base(source, remote)
    tip = repo.branch_sha(spec.cleaned)
    if tip is None:
        raise GitError(f"the cleaned branch {spec.cleaned!r} does not exist yet",
                       f"Run `retcon-sandbox execute {spec.path.name}` first, or verify a "
                       f"revision range: retcon-sandbox verify {spec.remote}..{spec.source} "
                       f"--spec {spec.path.name}")
    if not repo.is_ancestor(base, tip):
        raise GitError(f"the cleaned branch {spec.cleaned!r} does not descend from the "
                       f"merge-base of {spec.source} and {spec.remote} ({base[:12]})")
    return f"{spec.cleaned} (from {base[:7]})", repo.commits_in(tip, base)


def revision_range(repo: Repo, target: RangeTarget) -> tuple[str, list[tuple[str, str, str]]]:
    tip = repo.resolve(target.tip)
    base = repo.resolve(target.base) if target.base is not None else None
    return target.text, repo.commits_in(tip, base)


# --- showing it --------------------------------------------------------------------------------


class Display:
    """Plain lines, one per commit as it finishes (stdout is not a terminal). `quiet`
    (--quiet): no header and no rows, only the failures and the verdict."""

    def __init__(self, plan: Plan, commands: Commands, out: TextIO, quiet: bool = False) -> None:
        self.quiet = quiet
        self.rows = plan.rows
        self.shard_line = plan.shard_line
        self.planned = {"build": bool(commands.planned("build")),
                        "test": bool(commands.planned("test"))}
        self.digits = len(str(len(plan.rows)))
        self.out = out
        self.width = 200

    def line(self, row: Row) -> str:
        return render_row(row, self.planned, time.monotonic(), self.width, self.digits)

    def begin(self) -> None:
        if not self.quiet:
            self.out.write(header(self.width, self.digits) + "\n")
            self.out.flush()

    def finished(self, row: Row) -> None:
        if not self.quiet:
            self.out.write(self.line(row) + "\n")
            self.out.flush()

    def tick(self) -> None:
        pass

    def end(self, seconds: float) -> int:
        t = totals(self.rows)
        lines = failures(self.rows)
        if lines:
            self.out.write("\nFailures:\n" + "\n".join(lines) + "\n")
        lines = [] if self.quiet else claims(self.rows)
        if lines:
            self.out.write("\nClaimed by others (notes your key does not authenticate):\n"
                           + "\n".join(lines) + "\n")
        self.out.write("\n" + (self.shard_line + "; " if self.shard_line else "")
                       + summary(t, seconds) + "\n")
        if not t.ok:
            self.out.write("Exit 3: fix the failing commits (the tails of their output are "
                           "above) and verify again; --no-cache runs cached ones again.\n")
        self.out.flush()
        return EXIT_OK if t.ok else EXIT_STUCK


class LiveDisplay(Display):
    """The whole table, redrawn in place (stdout is a terminal)."""

    def __init__(self, plan: Plan, commands: Commands, out: TextIO) -> None:
        super().__init__(plan, commands, out)
        self.width = shutil.get_terminal_size().columns - 1
        self.shown: list[str] = []

    def draw(self, again: bool) -> None:
        lines = [self.line(row) for row in self.rows]
        if again and lines == self.shown:
            return
        text = f"\x1b[{len(self.rows)}F" if again else ""
        self.out.write(text + "".join("\x1b[2K" + line + "\n" for line in lines))
        self.out.flush()
        self.shown = lines

    def begin(self) -> None:
        super().begin()
        self.draw(again=False)

    def finished(self, row: Row) -> None:
        pass

    def tick(self) -> None:
        doing = {a.key: a.phase for a in progress.running() if a.key is not None}
        for row in self.rows:
            row.phase = doing.get(row.tree, "") if row.state == "running" else ""
        self.draw(again=True)

    def end(self, seconds: float) -> int:
        self.draw(again=True)
        return super().end(seconds)


class JsonDisplay(Display):
    """One `commit_verified` event per commit, then `verify_summary`."""

    def __init__(self, plan: Plan, commands: Commands, reporter: Reporter) -> None:
        super().__init__(plan, commands, sys.stdout)
        self.reporter = reporter

    def begin(self) -> None:
        pass

    def finished(self, row: Row) -> None:
        outcome = row.outcome
        assert outcome is not None
        stages = {s.which: s.verdict for s in outcome.stages}
        self.reporter.emit("commit_verified", number=row.number, sha=row.sha, tree=row.tree,
                           subject=row.subject, passed=outcome.passed,
                           build=stages.get("build"), tests=stages.get("test"),
                           seconds=round(outcome.seconds, 3), cached=outcome.cached,
                           tail=None if outcome.passed else outcome.tail,
                           claimed_by_others=claimed(row))

    def end(self, seconds: float) -> int:
        t = totals(self.rows)
        code = EXIT_OK if t.ok else EXIT_STUCK
        self.reporter.emit("verify_summary", commits=t.commits, passed=t.passed,
                           failed=t.failed, cached=t.cached, seconds=round(seconds, 3),
                           failing=[r.sha for r in self.rows if r.outcome and
                                    not r.outcome.passed], exit_code=code)
        return code


def make_display(as_json: bool, reporter: Reporter, plan: Plan, commands: Commands) -> Display:
    if as_json:
        return JsonDisplay(plan, commands, reporter)
    lines = shutil.get_terminal_size().lines
    if verbosity() < 0:
        return Display(plan, commands, sys.stdout, quiet=True)
    if sys.stdout.isatty() and not plain_terminal() and len(plan.rows) + 4 < lines:
        return LiveDisplay(plan, commands, sys.stdout)
    return Display(plan, commands, sys.stdout)
