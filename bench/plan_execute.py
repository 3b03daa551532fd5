"""`plan`, then `execute` with no model, on the benchmark's Python ranges, in the Docker sandbox:
does the draft reach a complete run, every commit built and tested, and the tree check?

    python3 bench/plan_execute.py [--mirrors DIR] [--mode sequential] [--only TEXT]
    python3 bench/plan_execute.py --guessed [--ranges bench/plan_heldout.toml]

Each range is first checked at its first and last real commit with its project's own setup and
tests (bench/plan_ranges.toml; `retcon-sandbox verify`): a range whose tests fail at either
cannot say anything of the draft and is listed as such. Then its messy branch is planned (the
guessed test command replaced by the project's), executed, and the outcome printed: complete
with the tree check, or the commit, the phase and the first test that failed (what the draft
could not make buildable). With --guessed, the draft keeps the build and test commands `plan`
guessed, and the setup it suggests uncommented: what a user gets by opting in to that one line.
Slow (real builds and tests): minutes per range. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realhistory import (
    MODES,
    RANGES,
    Range,
    build,
    find_mirror,
    gold,
    load_ranges,
    messify,
    mirror_roots,
    real_steps,
)

CLI = [sys.executable, "-m", "retcon_sandbox"]


@dataclass(frozen=True)
class Outcome:
    range: str
    mode: str
    commits: int
    result: str  # complete | failed at #k (phase) | tip fails | plan failed


ALLOWED: list[str] = []  # --setup-allow-address for verify and execute (--allow)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    if args[0] in ("verify", "execute"):
        args = [*args, *(f"--setup-allow-address={a}" for a in ALLOWED)]
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)


def sandbox_section(r: Range) -> str:
    lines = ["[sandbox]"]
    if r.setup:
        lines.append(f"setup = {r.setup!r}".replace("'", '"'))
    lines += ['build = "python3 -m compileall -q ."', f'test = "{r.test}"']
    return "\n".join(lines) + "\n"


def with_commands(spec: str, r: Range) -> str:
    """The planned spec with the project's own setup and tests instead of the guessed ones."""
    head, _, rest = spec.partition("[sandbox]\n")
    body = rest[rest.index("\n[[commit]]"):]
    return head + sandbox_section(r) + body


def runs_here(repo: Path, r: Range) -> bool:
    """Whether the range's tests pass at its first and last commit: else no draft can pass
    them at every commit (a base without `tests/`, code this Python cannot run)."""
    spec = repo / "tip.toml"
    spec.write_text('source = "feature"\nremote = "main"\ncleaned = "tip-clean"\n\n'
                    + sandbox_section(r) + '\n[[commit]]\nmessage = "all"\nhints = "all"\n')
    return all(run(["verify", rev, "--spec", str(spec)], repo).returncode == 0
               for rev in ("feature", "main"))


def failure(out: str) -> str:
    commit = re.findall(r"^Commit (\d+)/(\d+)", out, re.MULTILINE)
    phase = re.findall(r"^\s+(Building|Tests)\.\.\. FAIL", out, re.MULTILINE)
    where = f"#{commit[-1][0]}/{commit[-1][1]}" if commit else "?"
    first = re.search(r"^\s*(?:FAILED|ERROR) (\S+)", out, re.MULTILINE)
    return f"failed at {where} ({phase[-1].lower() if phase else 'stopped'})" + \
        (f": {first.group(1)[:80]}" if first else "")


def gold_spec(r: Range, mirror: Path, repo: Path) -> str:
    """The spec of the gold plan: each changed file in the last real commit that touched it."""
    listed = subprocess.run(["git", "-C", str(repo), "diff", "--no-renames", "-z", "--name-only",
                             "main", "feature"], capture_output=True, text=True, check=True)
    groups = gold(real_steps(mirror, r), [p for p in listed.stdout.split("\0") if p])
    commits = "".join(f'\n[[commit]]\nmessage = "gold {i}"\npaths = {json.dumps(g)}\n'
                      f"history = []\n" for i, g in enumerate(groups, 1))
    return ('source = "feature"\nremote = "main"\ncleaned = "feature-clean"\n\n'
            + sandbox_section(r) + commits)


def opted_in(spec: str) -> str:
    """The drafted spec with its suggested setup uncommented (`# setup = ...`)."""
    return spec.replace("\n# setup = ", "\nsetup = ", 1)


def measure(r: Range, mode: str, mirror: Path, tmp: Path, tips: dict[str, bool],
            use_gold: bool, guessed: bool = False) -> Outcome:
    repo = build(tmp / f"{r.name.replace('/', '+')}-{mode}", mirror, r, messify(mirror, r, mode))
    if r.name not in tips:  # the same trees whatever the mode
        tips[r.name] = runs_here(repo, r)
    if not tips[r.name]:
        return Outcome(r.name, mode, 0, "its tests fail at its first or last commit here")
    spec = repo / "spec.toml"
    if use_gold:
        spec.write_text(gold_spec(r, mirror, repo))
    else:
        planned = run(["plan", "--source", "feature", "--remote", "main", "-o", "spec.toml"],
                      repo)
        if planned.returncode != 0:
            return Outcome(r.name, mode, 0, f"plan failed: {planned.stderr.strip()[:200]}")
        text = spec.read_text()
        spec.write_text(opted_in(text) if guessed else with_commands(text, r))
    commits = spec.read_text().count("[[commit]]")
    done = run(["execute", "spec.toml", "--non-interactive"], repo)
    if done.returncode == 0 and "Tree check: cleaned == source ✓" in done.stdout:
        return Outcome(r.name, mode, commits, "complete, tree check ✓")
    return Outcome(r.name, mode, commits, failure(done.stdout + done.stderr))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors")
    parser.add_argument("--mode", choices=MODES, action="append")
    parser.add_argument("--only")
    parser.add_argument("--allow", action="append", default=[], metavar="ADDR",
                        help="--setup-allow-address for setup (a network whose resolver "
                        "answers with a reserved address, as a TLS-intercepting one may)")
    parser.add_argument("--gold", action="store_true",
                        help="execute the gold plan instead of plan's draft (one mode is enough)")
    parser.add_argument("--guessed", action="store_true",
                        help="keep the draft's guessed commands, its suggested setup uncommented")
    parser.add_argument("--ranges", type=Path, default=RANGES,
                        help="the ranges (default: bench/plan_ranges.toml)")
    args = parser.parse_args()
    ALLOWED[:] = args.allow
    roots = mirror_roots(args.mirrors)
    ranges = [r for r in load_ranges(args.ranges) if r.language == "python" and r.test
              and (not args.only or args.only in r.name)]
    print("| range | mode | commits | outcome |\n|---|---|---:|---|", flush=True)
    outcomes = []
    tips: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="retcon-bench-execute-") as tmp:
        for r in ranges:
            mirror = find_mirror(r.repo, roots)
            for mode in args.mode or MODES:
                o = measure(r, mode, mirror, Path(tmp), tips, args.gold, args.guessed)
                outcomes.append(o)
                print(f"| {o.range} | {o.mode} | {o.commits} | {o.result} |", flush=True)
    runnable = [o for o in outcomes if not o.result.startswith("its tests fail")]
    complete = sum(o.result.startswith("complete") for o in runnable)
    print(f"\n{complete} of {len(runnable)} runnable drafts complete with the tree check "
          f"({len(outcomes) - len(runnable)} drafts of ranges whose tests fail at their first or "
          "last commit left out).")


if __name__ == "__main__":
    main()
