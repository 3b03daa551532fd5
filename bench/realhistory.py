"""Real histories made messy, for the planner's benchmark (bench/plan.py, bench/plan_execute.py).

A range is N consecutive first-parent commits of a public project (bench/plan_ranges.toml).
Its *gold* plan puts each changed file in the last real commit that touched it. A *messy*
branch ends at the same tree as the range's last commit but gets there through WIP commits
that hide the real boundaries, in one of three ways:

- `sequential`: the real file changes in their real order, cut into WIP commits of 1 to 4
  file changes that ignore where the real commits end;
- `shuffled`: the changed files dealt out at random, 1 to 4 per WIP commit, each at its final
  content;
- `human`: how people commit: mostly a real change per WIP commit, but two merged into one,
  one split in two, a file forgotten and added in a later `fixup!`, the files written
  unformatted and a sweeping "format" commit that fixes them all, and vague messages.

Everything is built with git plumbing (`fast-import`) in a repository that borrows the
project's objects (alternates): nothing is checked out. The same range, mode and seed give the
same commits, byte for byte.
"""

from __future__ import annotations

import os
import random
import subprocess
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ZERO = "0" * 40
RANGES = Path(__file__).with_name("plan_ranges.toml")
MODES = ("sequential", "shuffled", "human")
NOISE = ("wip", "WIP", "more", "fix", "fix tests", "stuff", "tmp", "more work", "oops",
         "address review", "try again", "changes", "update", "fix build", "cleanup")
FORMATTERS = {"python": "run black", "rust": "cargo fmt", "javascript": "prettier"}


@dataclass(frozen=True)
class Range:
    name: str  # owner/name#n
    repo: str  # owner/name
    language: str
    base: str
    commits: tuple[str, ...]  # first-parent, oldest first
    setup: str | None = None
    build: str | None = None
    test: str | None = None
    image: str | None = None

    @property
    def tip(self) -> str:
        return self.commits[-1]


@dataclass(frozen=True)
class Op:
    """One file change: `mode` and `blob` (an object id, or bytes to write), or a deletion."""

    path: str
    mode: str | None
    blob: str | bytes | None

    @property
    def deleted(self) -> bool:
        return self.mode is None


@dataclass
class Messy:
    commits: list[tuple[str, list[Op]]] = field(default_factory=list)  # message, changes


def load_ranges(path: Path = RANGES) -> list[Range]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for item in data["range"]:
        commits = tuple(item["commits"])
        out.append(Range(f"{item['repo']}#{item['index']}", item["repo"], item["language"],
                         item["base"], commits, item.get("setup"), item.get("build"),
                         item.get("test"), item.get("image")))
    return out


# --- git, plainly (this is a benchmark of public repositories, not the tool's host side) -----


def git(gitdir: Path, *args: str, data: bytes | None = None) -> str:
    out = subprocess.run(["git", f"--git-dir={gitdir}", *args], input=data, check=True,
                         capture_output=True)
    return out.stdout.decode("utf-8", "surrogateescape")


def find_mirror(repo: str, roots: Sequence[Path]) -> Path:
    """The git directory of `repo` (owner/name) under one of `roots`: `owner+name/repo` as the
    fetch tool lays it out, or `owner+name.git` as `fetch_repos` clones it."""
    name = repo.replace("/", "+")
    for root in roots:
        for candidate in (root / name / "repo" / ".git", root / name / "repo",
                          root / f"{name}.git"):
            if (candidate / "objects").is_dir():
                return candidate
    raise SystemExit(f"{repo}: not found under {', '.join(map(str, roots))}; run "
                     "`python3 bench/plan.py --fetch` where GitHub answers, or give --mirrors")


def mirror_roots(given: str | None) -> list[Path]:
    roots = [Path(given)] if given else []
    roots += [Path(os.environ.get("RETCON_BENCH_REPOS", Path.home() / ".cache" /
                                  "retcon-sandbox-bench")), Path("/work/.mirror")]
    return roots


def fetch_repos(ranges: Sequence[Range], root: Path) -> None:
    """Clone every listed project (bare) into `root`, where GitHub answers."""
    root.mkdir(parents=True, exist_ok=True)
    for repo in sorted({r.repo for r in ranges}):
        target = root / f"{repo.replace('/', '+')}.git"
        if not target.exists():
            subprocess.run(["git", "clone", "--bare", "--quiet",
                            f"https://github.com/{repo}.git", str(target)], check=True)


def file_changes(gitdir: Path, old: str, new: str) -> list[Op]:
    """The paths that differ between two commits, as changes to apply (no rename detection)."""
    out = git(gitdir, "diff-tree", "-r", "-z", "--no-renames", old, new)
    fields = out.split("\0")
    ops = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        parts = meta.lstrip(":").split()
        if len(parts) != 5:
            continue
        new_mode, new_sha = parts[1], parts[3]
        ops.append(Op(path, None, None) if new_sha == ZERO else Op(path, new_mode, new_sha))
    return ops


def real_steps(gitdir: Path, r: Range) -> list[list[Op]]:
    parents = (r.base, *r.commits[:-1])
    return [file_changes(gitdir, old, new) for old, new in zip(parents, r.commits, strict=True)]


def gold(steps: Sequence[Sequence[Op]], changed: Sequence[str]) -> list[list[str]]:
    """Each changed file in the last real commit that touched it (commits that own none
    dropped), in the real order."""
    last = {op.path: i for i, step in enumerate(steps) for op in step}
    groups: dict[int, list[str]] = {}
    for p in changed:
        groups.setdefault(last[p], []).append(p)
    return [groups[i] for i in sorted(groups)]


# --- the three messy branches ----------------------------------------------------------------


def _chunks(items: list[Op], rng: random.Random) -> list[list[Op]]:
    out: list[list[Op]] = []
    i = 0
    while i < len(items):
        n = rng.randint(1, 4)
        out.append(items[i:i + n])
        i += n
    return out


def sequential(steps: Sequence[Sequence[Op]], rng: random.Random) -> Messy:
    stream = [op for step in steps for op in step]
    return Messy([(rng.choice(NOISE), chunk) for chunk in _chunks(stream, rng)])


def shuffled(final: Sequence[Op], rng: random.Random) -> Messy:
    files = list(final)
    rng.shuffle(files)
    return Messy([(rng.choice(NOISE), chunk) for chunk in _chunks(files, rng)])


def _unformatted(gitdir: Path, op: Op, cache: dict[str, bytes | None]) -> Op:
    """The change as a person writes it before the formatter runs: a regular text file gets
    trailing blanks on its first line; anything else is unchanged."""
    if op.deleted or op.mode not in ("100644", "100755") or not isinstance(op.blob, str):
        return op
    if op.blob not in cache:
        data = subprocess.run(["git", f"--git-dir={gitdir}", "cat-file", "blob", op.blob],
                              check=True, capture_output=True).stdout
        cache[op.blob] = None if b"\0" in data[:8000] or len(data) > 1 << 20 else data
    kept = cache[op.blob]
    if kept is None:
        return op
    head, sep, rest = kept.partition(b"\n")
    return Op(op.path, op.mode, head + b"  " + sep + rest)


def human(gitdir: Path, steps: Sequence[Sequence[Op]], subjects: Sequence[str],
          rng: random.Random, formatter: str) -> Messy:
    """Real changes mostly kept together, with merges, splits, forgotten files, a late format
    sweep and vague messages."""
    numbered = [[(n, op) for op in step] for n, step in enumerate(steps)]
    planned: list[tuple[str, list[tuple[int, Op]]]] = []
    i = 0
    while i < len(steps):
        ops, subject = list(numbered[i]), subjects[i]
        while i + 1 < len(steps) and rng.random() < 0.25:  # two concerns in one commit
            i += 1
            ops += numbered[i]
        i += 1
        message = f"{subject} (wip)" if rng.random() < 0.4 else rng.choice(NOISE)
        if len(ops) >= 2 and rng.random() < 0.35:  # committed in two goes
            cut = rng.randint(1, len(ops) - 1)
            planned += [(message, ops[:cut]), (rng.choice(NOISE), ops[cut:])]
        else:
            planned.append((message, ops))
    forgotten: dict[int, list[tuple[str, tuple[int, Op]]]] = {}  # due -> message, change
    for n, (message, ops) in enumerate(planned):
        if len(ops) >= 2 and rng.random() < 0.3:
            late = ops.pop(rng.randrange(len(ops)))
            due = min(n + rng.randint(1, 3), len(planned))
            forgotten.setdefault(due, []).append((f"fixup! {message}", late))
    writer = _Writer(gitdir, int(len(planned) * rng.uniform(0.6, 0.8)) or 1, formatter)
    for n, (message, ops) in enumerate([*planned, ("", [])]):
        writer.write(n, message, ops)
        for fix_message, late in forgotten.get(n, []):
            writer.write(n, fix_message, [late])
    writer.sweep()
    return writer.messy


class _Writer:
    """Writes changes as WIP commits: before the sweep, text files unformatted; never an
    older version of a file over a newer one (a forgotten change that came due too late)."""

    def __init__(self, gitdir: Path, sweep_at: int, formatter: str) -> None:
        self.gitdir, self.sweep_at, self.formatter = gitdir, sweep_at, formatter
        self.messy = Messy()
        self.cache: dict[str, bytes | None] = {}
        self.real: dict[str, Op] = {}  # files written unformatted: their real state
        self.version: dict[str, int] = {}  # path -> the real commit of what was written

    def sweep(self) -> None:
        if self.real:
            self.messy.commits.append((self.formatter, list(self.real.values())))
            self.real.clear()

    def write(self, n: int, message: str, ops: list[tuple[int, Op]]) -> None:
        if n == self.sweep_at:
            self.sweep()
        written = []
        for seq, op in ops:
            if self.version.get(op.path, -1) > seq:
                continue
            self.version[op.path] = seq
            shown = _unformatted(self.gitdir, op, self.cache) if n < self.sweep_at else op
            if shown is not op:
                self.real[op.path] = op
            else:
                self.real.pop(op.path, None)
            written.append(shown)
        if written:
            self.messy.commits.append((message, written))


def messify(gitdir: Path, r: Range, mode: str, seed: int = 0) -> Messy:
    rng = random.Random(f"{r.name}/{mode}/{seed}")
    steps = real_steps(gitdir, r)
    if mode == "sequential":
        return sequential(steps, rng)
    if mode == "shuffled":
        return shuffled(file_changes(gitdir, r.base, r.tip), rng)
    subjects = [git(gitdir, "log", "-1", "--format=%s", c).strip() for c in r.commits]
    return human(gitdir, steps, subjects, rng, FORMATTERS.get(r.language, "format"))


# --- the repository the planner reads --------------------------------------------------------


def build(workdir: Path, mirror: Path, r: Range, messy: Messy) -> Path:
    """A repository at `workdir` whose `main` is the range's base and whose `feature` is the
    messy branch (its objects borrowed from the mirror). Its path."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(workdir)], check=True)
    gitdir = workdir / ".git"
    (gitdir / "objects" / "info" / "alternates").write_text(
        str((mirror / "objects").resolve()) + "\n")
    stream = bytearray()
    when = 1_700_000_000
    for n, (message, ops) in enumerate(messy.commits):
        encoded = message.encode()
        stream += (f"commit refs/heads/feature\ncommitter Bench <bench@example.com> "
                   f"{when + 60 * n} +0000\ndata {len(encoded)}\n").encode() + encoded + b"\n"
        if n == 0:
            stream += f"from {r.base}\n".encode()
        for op in ops:
            quoted = _quote(op.path)
            if op.deleted:
                stream += b"D " + quoted + b"\n"
            elif isinstance(op.blob, bytes):
                stream += f"M {op.mode} inline ".encode() + quoted + \
                    f"\ndata {len(op.blob)}\n".encode() + op.blob + b"\n"
            else:
                stream += f"M {op.mode} {op.blob} ".encode() + quoted + b"\n"
    subprocess.run(["git", f"--git-dir={gitdir}", "fast-import", "--quiet"], input=bytes(stream),
                   check=True)
    git(gitdir, "update-ref", "refs/heads/main", r.base)
    _tags(mirror, gitdir, r.base)
    source_tree = git(gitdir, "rev-parse", "feature^{tree}").strip()
    if source_tree != git(gitdir, "rev-parse", f"{r.tip}^{{tree}}").strip():
        raise SystemExit(f"{r.name}: the messy branch does not end at the range's tree")
    return workdir


def _tags(mirror: Path, gitdir: Path, base: str) -> None:
    """The project's tags on the base's history, as a clone has them (a version read from git,
    setuptools-scm or hatch-vcs, needs them)."""
    listed = git(mirror, "for-each-ref", "--format=%(refname) %(objectname)",
                 f"--merged={base}", "refs/tags/")
    updates = "".join(f"create {line}\n" for line in listed.splitlines() if line)
    if updates:
        git(gitdir, "update-ref", "--stdin", data=updates.encode())


def _quote(path: str) -> bytes:
    raw = path.encode("utf-8", "surrogateescape")
    if any(c in raw for c in b'"\n\\') or raw.startswith(b'"'):
        return b'"' + raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(
            b"\n", b"\\n") + b'"'
    return raw
