"""`retcon-sandbox plan`: draft the history spec from the messy branch, so `plan` then
`execute` turn it into a clean one. `plan --check SPEC`: what a spec's `paths` leave uncovered
or cover twice, before a run.

The draft is deterministic (see `plan/draft.py`); with a model configured, the model reads the
diff through the sandboxed, read-only file tools and proposes the commits and their messages,
and code makes sure every changed file is in exactly one commit. Everything is read and checked
before anything is written; the spec is written atomically, and never over an existing file
without --force.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from retcon_sandbox.backends.api import Sandbox
from retcon_sandbox.backends.environments import Environments
from retcon_sandbox.backends.manifests import REGULAR
from retcon_sandbox.backends.workspace import WorkState
from retcon_sandbox.commands.options import (
    NO_ACCESS,
    ModelOptions,
    find_repo,
    make_agent,
    make_backend,
)
from retcon_sandbox.errors import EXIT_OK, EXIT_UNCOVERED, GitError, SpecError, UsageError
from retcon_sandbox.outfile import OutFile
from retcon_sandbox.plan.coverage import Coverage, Proposed, Repairs, check, repair
from retcon_sandbox.plan.draft import (
    EVIDENCE_LIMIT,
    Group,
    draft,
    for_a_model,
    shared_by,
    with_versions,
)
from retcon_sandbox.plan.evidence import layout_only
from retcon_sandbox.plan.facts import Change, Facts, MessyCommit
from retcon_sandbox.plan.order import derive
from retcon_sandbox.plan.render import (
    SETUP_TEXTS,
    Branches,
    guess_commands,
    path_pattern,
    spec_text,
)
from retcon_sandbox.repo import checks
from retcon_sandbox.repo.gitrepo import Repo, refuse_dotgit
from retcon_sandbox.report import HumanReporter, Reporter, make_reporter, verbosity, watching
from retcon_sandbox.spec.file import Spec, SpecFile
from retcon_sandbox.spec.settings import DEFAULTS
from retcon_sandbox.spec.statedir import StateDir
from retcon_sandbox.text import sanitize, sanitize_name

TEXT_LIMIT = 512 * 1024  # larger files are not read (for imports and shared identifiers)
LAYOUT_BYTES = 64 * 1024 * 1024  # read at once to tell formatters' sweeps; a larger one is none
CODE_SUFFIXES = (".py", ".rs", ".js", ".jsx", ".ts", ".tsx", ".mjs", ".cjs")
LOG_SUBJECTS = 30


@dataclass(frozen=True)
class Target:
    repo: Repo
    branches: Branches
    source: str  # resolved commits
    remote: str
    base: str


def run(args: argparse.Namespace) -> int:
    if args.check and (args.output or args.force or args.source or args.remote or args.cleaned
                       or args.model):
        raise UsageError("--check SPEC takes the branches from the spec and writes nothing",
                         "Give --check alone (with --repo, --json), or plan without it.")
    # without -o the spec goes to stdout: the human lines go to stderr
    out = sys.stdout if args.output or args.check else sys.stderr
    reporter = make_reporter(True) if args.json else HumanReporter(out)
    if args.check:
        return check_spec(args, reporter)
    with watching(reporter, None if args.json else out):
        return make_plan(args, reporter)


# --- which branches ------------------------------------------------------------------------


def _repo(args: argparse.Namespace) -> Repo:
    """--repo DIR, else the repository containing the current directory."""
    return find_repo(Path(args.repo) if args.repo else None, None)


def choose(repo: Repo, source: str | None, remote: str | None, cleaned: str | None) -> Target:
    """Source: --source, else the current branch. Remote: --remote, else `default_remote`.
    Cleaned: --cleaned, else `<source>-clean`."""
    if source is None:
        source = repo.current_branch()
        if source is None:
            raise UsageError("HEAD is detached, so there is no current branch to plan",
                             "Give the messy branch: --source BRANCH.")
    source_sha = repo.resolve(source)
    if remote is None:
        remote = default_remote(repo, source, source_sha)
    remote_sha = repo.resolve(remote)
    if remote_sha == source_sha:
        raise GitError(f"nothing to plan: {source} and {remote} are the same commit")
    base = repo.merge_base(source_sha, remote_sha)
    if cleaned is None:
        full = repo.full_ref(source)
        name = full.removeprefix("refs/heads/") if full.startswith("refs/heads/") else \
            full.removeprefix("refs/remotes/").split("/", 1)[-1] if full else source
        cleaned = f"{name}-clean"
    problem = repo.branch_name_problem(cleaned)
    if problem:
        raise UsageError(f"--cleaned: {cleaned!r} is not a valid branch name ({problem})")
    for ref in (source, remote):
        if repo.full_ref(ref) == f"refs/heads/{cleaned}":
            raise UsageError(f"--cleaned: {cleaned!r} is the branch {ref!r}; the cleaned branch "
                             "is rewritten, so it must be another")
    return Target(repo, Branches(source, remote, cleaned), source_sha, remote_sha, base)


def default_remote(repo: Repo, source: str, source_sha: str) -> str:
    """The branch the source will merge into: of its upstream (unless that is its own copy on a
    remote, `origin/feature`), `main`, `master` and their copies on the upstream's remote and
    `origin`, the one that shares the most history with it (the fewest commits of the source's
    own since their merge-base: a stale local `main` loses to a newer `origin/main` the branch
    merged). Ties go to the earlier in that order."""
    upstream = repo.upstream_of(source)
    own = repo.full_ref(source).removeprefix("refs/heads/") or source
    remote_name = upstream.split("/", 1)[0] if upstream and "/" in upstream else "origin"
    names = [upstream] if upstream and upstream.split("/", 1)[-1] != own else []
    names += ["main", "master"] + [f"{r}/{n}" for r in dict.fromkeys((remote_name, "origin"))
                                   for n in ("main", "master")]
    found: list[tuple[int, int, str]] = []
    shas = repo.resolve_all(list(dict.fromkeys(names)))  # one git call for them all
    for order, name in enumerate(dict.fromkeys(names)):
        sha = shas.get(name)  # None: no such branch
        if sha is None or sha == source_sha:
            continue
        try:
            ahead = len(repo.commits_in(source_sha, repo.merge_base(source_sha, sha)))
        except GitError:  # no history in common
            continue
        found.append((ahead, order, name))
    if not found:
        raise GitError(f"no branch to plan {source!r} against: none of " + ", ".join(
            dict.fromkeys(names)) + " is another commit with history in common with it",
            "Give the branch it will merge into: --remote BRANCH.")
    return min(found)[2]


# --- what the planner reads ----------------------------------------------------------------


def _texts(repo: Repo, *wanted: dict[str, str]) -> list[dict[str, str]]:
    """For each of `wanted` (path -> blob), path -> the blob read as UTF-8 text: those under
    TEXT_LIMIT that are text. The blobs of all are read together, in one batch."""
    data = repo.small_blobs([blob for w in wanted for blob in w.values()], TEXT_LIMIT)
    return [{path: text for path, blob in w.items() if (text := _decoded(data, blob)) is not None}
            for w in wanted]


def _decoded(data: dict[str, bytes], blob: str) -> str | None:
    """`blob` of `data` as UTF-8 text, or None: not read, or not text."""
    try:
        return data[blob].decode("utf-8") if blob in data else None
    except UnicodeDecodeError:
        return None


Pairs = list[tuple[str, str]]  # a messy commit's changed files: the blob before, and after


def _laid_out(repo: Repo, commits: tuple[MessyCommit, ...], changed: set[str]
              ) -> tuple[MessyCommit, ...]:
    """The commits, each that only laid out anew 3 or more of the branch's changed files
    marked `layout`: each of those modified (not added, deleted or binary; a text of at most
    TEXT_LIMIT bytes) and its words kept (layout_only). Both sides are read up to about
    LAYOUT_BYTES at a time, so that a long history is never held whole."""
    candidates: list[tuple[MessyCommit, Pairs]] = []
    for commit in commits:
        pairs = [(old, new) for path, (old, new) in zip(commit.paths, commit.blobs, strict=True)
                 if path in changed and old and new and old != new]
        if len(pairs) >= 3 and len(pairs) == len(changed.intersection(commit.paths)):
            candidates.append((commit, pairs))
    sizes = repo.blob_sizes([b for _, pairs in candidates for pair in pairs for b in pair])
    marked: set[int] = set()
    batch: list[tuple[MessyCommit, Pairs]] = []
    total = 0
    for commit, pairs in candidates:
        each = [sizes.get(b, TEXT_LIMIT + 1) for pair in pairs for b in pair]
        if max(each) > TEXT_LIMIT or sum(each) > LAYOUT_BYTES:
            continue
        if batch and total + sum(each) > LAYOUT_BYTES:
            marked |= _layout_commits(repo, batch)
            batch, total = [], 0
        batch.append((commit, pairs))
        total += sum(each)
    marked |= _layout_commits(repo, batch)
    return tuple(replace(c, layout=True) if id(c) in marked else c for c in commits)


def _layout_commits(repo: Repo, batch: list[tuple[MessyCommit, Pairs]]) -> set[int]:
    """The ids of the commits of `batch` whose every pair is only laid out anew."""
    if not batch:
        return set()
    data = repo.small_blobs([b for _, pairs in batch for pair in pairs for b in pair],
                            TEXT_LIMIT)

    def laid_out(pairs: Pairs) -> bool:
        texts = ((_decoded(data, old), _decoded(data, new)) for old, new in pairs)
        return all(a is not None and b is not None and layout_only(a, b) for a, b in texts)

    return {id(commit) for commit, pairs in batch if laid_out(pairs)}


def read_facts(target: Target) -> Facts:
    repo = target.repo
    entries = repo.diff_entries(target.base, target.source)
    if not entries:
        raise GitError(f"nothing to plan: {target.branches.source} changes nothing against "
                       f"{target.branches.remote} (their trees are the same)")
    for path, *_ in entries:
        refuse_dotgit(path)
    changes = tuple(Change(path, status, old, new) for path, status, old, new in entries)
    commits = tuple(MessyCommit(subject, tuple(p for p, *_ in entries),
                                tuple((old, new) for _, _, old, new in entries), sha)
                    for sha, subject, entries in repo.commit_changes(target.source, target.base))
    code_only = len(changes) > EVIDENCE_LIMIT  # folders decide: only imports are read
    if not code_only:
        commits = _laid_out(repo, commits, {c.path for c in changes})
    readable = [c for c in changes if not code_only or c.path.endswith(CODE_SUFFIXES)]
    tree = repo.ls_tree(repo.tree_of(target.source))
    texts, base_texts, setup_texts = _texts(
        repo, {c.path: c.new_blob for c in readable if c.new_blob},
        {c.path: c.old_blob for c in readable if c.status != "A" and c.old_blob},
        {name: entry.sha for name in SETUP_TEXTS
         if (entry := tree.get(name)) and entry.mode in REGULAR})
    return Facts(changes, commits, frozenset(tree), texts, base_texts,
                 tuple(repo.subjects(target.remote, LOG_SUBJECTS)), setup_texts)


# --- plan ---------------------------------------------------------------------------------


def make_plan(args: argparse.Namespace, reporter: Reporter) -> int:
    repo = _repo(args)
    output = output_file(Path(args.output), args.force) if args.output else None
    if output is not None:
        output.check()
    target = choose(repo, args.source, args.remote, args.cleaned)
    facts = read_facts(target)
    out = sys.stdout if output is not None or args.json else sys.stderr
    drafted = draft(facts)
    groups = drafted.groups
    b = target.branches
    reporter.emit("plan_start", source=b.source, remote=b.remote, cleaned=b.cleaned,
                  base=target.base, files=len(facts.changes), messy_commits=len(facts.commits))
    talk = not args.json and verbosity() >= 0  # --quiet: the spec, warnings and the outcome
    if talk:
        print(sanitize(f"Planning {b.source} onto {b.remote} (merge-base {target.base[:7]}): "
                       f"{len(facts.changes)} changed file(s) in {len(facts.commits)} messy "
                       "commit(s)"), file=out)
    model = ModelOptions(args.model, args.base_url, args.model_timeout).settings()
    how = f"deterministic: {drafted.how}"
    if model is not None:
        groups, repairs = refine(args, target, facts, groups, reporter, out)
        how = (f"proposed by the model {model.model}, checked in code" if repairs.refused is None
               else f"deterministic (the model's proposal was refused: {repairs.refused})")
    if repo.branch_sha(b.cleaned):  # a new spec has no run that made it: execute refuses it
        reporter.emit("warning", message=f"the branch {b.cleaned!r} exists, and `execute` "
                      "works only on a cleaned branch that the spec's own runs created: give "
                      f"--cleaned NAME for a new one, delete it (git branch -D {b.cleaned}) if "
                      "it is an old result, or run `execute --adopt-branch` to add the commits "
                      "on top of it")
    groups = shared(repo, facts, groups, model is not None, reporter, out if talk else None)
    header = (f"Draft history spec for {b.source}, made by `retcon-sandbox plan` from "
              f"{len(facts.commits)} messy commit(s)\n({how}).\n"
              "A draft: review the grouping, order and messages before `retcon-sandbox "
              "execute`.\nA [[commit]] that lists `paths` needs no model; drop `paths` from a "
              "commit\nto let a model extract it by its hints instead.")
    text = spec_text(b, groups, guess_commands(facts.source_files, facts.setup_texts), header)
    exact(facts.paths, groups)
    show(groups, reporter, out if talk else None)
    if output is not None:
        try:
            output.write(text.encode("utf-8"))
        except OSError as exc:
            raise output.unwritten(exc) from None
    reporter.emit("plan_written", path=str(output.path) if output else None,
                  commits=len(groups),
                  files=len(facts.changes), **({} if output else {"spec": text}))
    if not args.json:
        written(output, text, talk)
    return EXIT_OK


def written(output: OutFile | None, text: str, talk: bool) -> None:
    """The spec on standard output, or where it went; and, unless --quiet, what next."""
    if output is None:  # exact into a file or pipe; on a terminal, shown as any text is
        sys.stdout.write(sanitize(text) if sys.stdout.isatty() else text)
        if talk:
            print(f"\nNext: save it (-o spec.toml), review it, then retcon-sandbox execute "
                  f"spec.toml\n{RESUME}", file=sys.stderr)
    elif talk:
        print(sanitize(f"\nDraft written: {output.path}\nNext: review it, then  "
                       f"retcon-sandbox execute {output.path}\n{RESUME}"))
    else:
        print(sanitize(f"Draft written: {output.path}"))


RESUME = ("The run saves each step in the spec: after a stop (a stuck commit, Ctrl-C, an "
          "error), the same\ncommand resumes where it stopped.")


def show(groups: list[Group], reporter: Reporter, out: TextIO | None) -> None:
    for number, group in enumerate(groups, 1):
        reporter.emit("plan_commit", number=number, subject=group.message.splitlines()[0],
                      paths=list(group.paths), model=group.model)
        if out is not None:
            print(sanitize(f"  {number}. {group.message.splitlines()[0]}  "
                           f"({len(group.paths)} file(s): "
                           + ", ".join(sanitize_name(p) for p in group.paths[:4])
                           + (", …" if len(group.paths) > 4 else "") + ")"
                           + (", for the model (no `paths`)" if group.model else "")), file=out)


HUNK_LINES = 40  # of one part of a shared file, in a hints commit


def shared(repo: Repo, facts: Facts, groups: list[Group], model: bool, reporter: Reporter,
           out: TextIO | None) -> list[Group]:
    """Files that two or more commits' work changed: said. Each earlier commit takes the file
    as its messy commits left it (`versions`), or with a model becomes a hints commit naming its
    part of the file; the last keeps the file whole."""
    parts = shared_by(facts, [g.paths for g in groups])
    for path, commits in parts.items():
        numbers = list(commits)
        reporter.emit("plan_shared", path=path, commits=numbers)
        if out is not None:
            others = "#" + ", #".join(map(str, numbers[:-1]))
            one = len(numbers) == 2
            print(sanitize(f"  Shared: {sanitize_name(path)} is changed by the work of {others} "
                           f"and #{numbers[-1]}: it goes whole in #{numbers[-1]}; " +
                           (f"{others} {'is' if one else 'are'} drafted for the model, which "
                            "takes their part" if model else f"{others} take{'s' if one else ''}"
                            f" it as {'its' if one else 'their'} messy commits left it")),
                  file=out)
    if not parts:
        return groups
    if not model:
        return with_versions(groups, parts, facts)
    return for_a_model(groups, parts, hunks(repo, facts, parts))


def hunks(repo: Repo, facts: Facts, parts: dict[str, dict[int, tuple[int, ...]]]
          ) -> dict[tuple[str, int], str]:
    """(path, commit) -> the diff of the part of the file that commit's messy commits made."""
    ends: dict[tuple[str, int], tuple[str | None, str | None]] = {}
    for path, commits in parts.items():
        for number, messy in list(commits.items())[:-1]:
            blobs = [dict(zip(facts.commits[i].paths, facts.commits[i].blobs, strict=False))
                     .get(path, (None, None)) for i in messy]
            ends[(path, number)] = (blobs[0][0], blobs[-1][1])
    texts = repo.small_blobs([b for pair in ends.values() for b in pair if b], TEXT_LIMIT)
    out = {}
    for key, (before, after) in ends.items():
        old, new = (texts.get(b, b"").decode("utf-8", "replace") if b else "" for b in
                    (before, after))
        lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="",
                                          n=1))[2:]
        out[key] = "\n".join(lines[:HUNK_LINES]) + \
            (f"\n… {len(lines) - HUNK_LINES} more line(s)" if len(lines) > HUNK_LINES else "")
    return out


def exact(paths: list[str], groups: list[Group]) -> None:
    """The written `paths` take every changed file exactly once (a name's `?` could match
    another name), but those a commit drafted for the model takes: otherwise stop, having
    written nothing."""
    coverage = check(paths, [(n, None if g.model else tuple(path_pattern(p) for p in g.paths))
                             for n, g in enumerate(groups, 1)])
    theirs = {p for g in groups if g.model for p in g.paths}
    if not coverage.complete or set(coverage.uncovered) - theirs:
        odd = list(coverage.twice) + [p for p in coverage.uncovered if p not in theirs]
        raise GitError("these changed files cannot be named exactly in `paths` (their names "
                       "hold characters a pattern cannot): "
                       + ", ".join(sanitize_name(p) for p in odd[:10]),
                       "Rename them on the source branch, or write those commits by hand.")


def output_file(output: Path, force: bool) -> OutFile:
    """-o FILE: a new file, or with --force a regular file replaced; never a symlink, device,
    pipe or directory (see outfile.py)."""
    return OutFile(output, "-o", "plan", "a spec file", replace=force, error=SpecError,
                   exists_hint="Give --force to replace it, or another -o FILE.",
                   otherwise=" (or run without -o to print the spec)")


# --- the model's refinement ------------------------------------------------------------------


def task_text(target: Target, facts: Facts, groups: list[Group]) -> str:
    status = {c.path: c.status for c in facts.changes}
    lines = [f"Source branch: {target.branches.source}; it merges into "
             f"{target.branches.remote}.", "", "Changed files:"]
    lines += [f"  {status[p]} {p}" for p in facts.paths]
    lines += ["", "Messy commits, oldest first:"]
    lines += [f"  {i}. {c.subject}: " + ", ".join(c.paths[:20]) for i, c in
              enumerate(facts.commits, 1)]
    lines += ["", f"Recent subjects of {target.branches.remote}:"]
    lines += [f"  {s}" for s in facts.log_subjects[:15]] or ["  (none)"]
    lines += ["", "Draft plan:"]
    for i, group in enumerate(groups, 1):
        lines.append(f"  {i}. {group.message.splitlines()[0]}: " + ", ".join(group.paths))
    return "\n".join(lines)


def refine(args: argparse.Namespace, target: Target, facts: Facts, groups: list[Group],
           reporter: Reporter, out: TextIO) -> tuple[list[Group], Repairs]:
    """The model's proposal, repaired so that every file is in exactly one commit; or, when it
    cannot be used, the draft (with `refused` saying why)."""
    from retcon_sandbox.model.tools import PLAN_TOOLS, GaveUp, Planned, Proposals, StepContext
    from retcon_sandbox.verify.stages import Commands, Verifier

    repo = target.repo
    state_dir = StateDir(repo.common_dir())
    label = state_dir.root / f"plan-{target.branches.source.replace('/', '-')}"
    transcript = state_dir.transcript_path(label)
    holder = Spec(label, "", "", "", DEFAULTS)
    backend = make_backend(args.sandbox, holder, DEFAULTS, NO_ACCESS,
                           engine_given=tuple(args.engine or ()))
    agent = make_agent(ModelOptions(args.model, args.base_url, args.model_timeout).settings(),
                       transcript, reporter)
    assert agent is not None
    envs = Environments(repo, backend, DEFAULTS, NO_ACCESS.setup, reporter, target.source)
    verifier = Verifier(Commands(None, None, DEFAULTS.timeout), reporter)
    proposals = Proposals(facts.paths)
    if not args.json and verbosity() >= 0:
        print(f"  Asking the model ({agent.model.name}) to refine the draft; transcript: "
              f"{transcript}", file=out)
    try:
        with contextlib.ExitStack() as stack:
            def open_box(tree: str) -> Sandbox:
                return stack.enter_context(envs.sandbox("plan", tree)).box

            state = WorkState(repo, open_box, repo.tree_of(target.base), target.source,
                              DEFAULTS.max_file_size)
            ctx = StepContext(state, verifier, proposals=proposals)
            outcome, usage = agent.run(ctx, task_text(target, facts, groups), "plan",
                                       PLAN_TOOLS, system="plan")
    finally:
        agent.transcript.close()
    reporter.emit("plan_model", tokens=usage.total, proposed=len(proposals.commits))
    if isinstance(outcome, GaveUp):
        repairs = Repairs(refused=f"the model did not finish: {outcome.summary[:200]}")
        reporter.emit("warning", message=f"the model's plan was not used ({repairs.refused}); "
              "the draft is written instead")
        return groups, repairs
    commits = outcome.commits if isinstance(outcome, Planned) else tuple(proposals.commits)
    proposed = [Proposed(m, p, h) for m, p, h in commits]
    fixed, repairs = repair(proposed, groups, derive(facts))
    if repairs.refused:
        reporter.emit("warning", message=f"the model's plan was not used ({repairs.refused}); "
              "the draft is written instead")
    elif repairs.any:
        detail = []
        if repairs.missed:
            detail.append(f"{len(repairs.missed)} file(s) it left out went back to their draft "
                          "commit")
        if repairs.repeated:
            detail.append(f"{len(repairs.repeated)} file(s) it named twice stay in the first")
        if repairs.unknown:
            detail.append(f"{len(repairs.unknown)} path(s) not in the diff were dropped")
        reporter.emit("warning", message="the model's plan was repaired: " + "; ".join(detail))
    return fixed, repairs


# --- check --------------------------------------------------------------------------------


def check_spec(args: argparse.Namespace, reporter: Reporter) -> int:
    specfile = SpecFile(Path(args.check))
    spec = specfile.load()
    repo = find_repo(Path(args.repo) if args.repo else None, specfile.real)
    revs = checks.revisions(repo, spec)
    paths = repo.changed_paths(revs.base, revs.source)
    coverage = check(paths, [(c.number, c.paths) for c in spec.commits])
    reporter.emit("plan_check", spec=str(args.check), files=len(paths),
                  complete=coverage.complete, uncovered=list(coverage.uncovered),
                  twice={p: list(n) for p, n in coverage.twice.items()},
                  unmatched={str(n): list(items) for n, items in coverage.unmatched.items()},
                  by_model=list(coverage.by_model))
    if not args.json:
        print(sanitize(describe(args.check, len(paths), coverage)))
    return EXIT_OK if coverage.complete else EXIT_UNCOVERED


def describe(name: str, files: int, coverage: Coverage) -> str:
    lines = [f"{name}: {files} changed file(s)"]
    if coverage.twice:
        lines.append(f"  ✗ {len(coverage.twice)} file(s) in the `paths` of two or more commits:")
        lines += [f"      {sanitize_name(p)}: #" + ", #".join(map(str, n))
                  for p, n in coverage.twice.items()]
    for number, items in coverage.unmatched.items():
        lines.append(f"  ✗ #{number}: paths match no changed file: "
                     + ", ".join(sanitize_name(i) for i in items))
    if coverage.uncovered:
        if coverage.by_model:
            lines.append(f"  · {len(coverage.uncovered)} file(s) in no commit's `paths`, left "
                         "to the hints-only commits #" + ", #".join(map(str, coverage.by_model))
                         + " (the model decides):")
        else:
            lines.append(f"  ✗ {len(coverage.uncovered)} file(s) in no commit's `paths` (a run "
                         "puts them in a catch-all commit at the end):")
        lines += [f"      {sanitize_name(p)}" for p in coverage.uncovered]
    elif coverage.by_model:
        lines.append("  · hints-only commits #" + ", #".join(map(str, coverage.by_model))
                     + " are covered by the model")
    lines.append("  ✓ every changed file is in exactly one commit" if coverage.complete
                 else "  Not fully covered: add the files to a commit's `paths`, or remove "
                 "them from all but one.")
    return "\n".join(lines)
