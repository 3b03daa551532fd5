"""Choose the planner benchmark's real ranges, reproducibly: this wrote bench/plan_ranges.toml.

    python3 bench/plan_select.py [--mirrors DIR] > bench/plan_ranges.toml
    python3 bench/plan_select.py --held-out [--mirrors DIR] > bench/plan_heldout.toml

`--held-out` draws the same way from six other projects (HELD_OUT), which the draft's weights
are never fitted on: `python3 bench/plan.py --ranges bench/plan_heldout.toml` shows what a
project the planner has not seen can expect.

For each project, windows of 5 to 12 consecutive first-parent commits are drawn at random
(seeded by the project's name) from its last 600, and the first three that qualify are kept:
12 to 120 changed files, at least 3 real commits that own a file (the last to touch it), none
owning more than 70 % of the files, and no overlap with a window already kept. Below 12 files
most real commits own one file, and one file placed either way moves any plan's ARI by 0.3:
such a range measures luck, not the planner. Nothing here
looks at what `plan` makes of a range: the ranges are chosen before and apart from the planner.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realhistory import Range, file_changes, find_mirror, git, gold, mirror_roots

PYTEST = "PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider tests"
# project -> language, and how its tests run in the sandbox (the same for every range of it)
PROJECTS: dict[str, dict[str, str]] = {
    "mahmoud/boltons": {"language": "python", "test": PYTEST},
    "more-itertools/more-itertools": {"language": "python", "test": PYTEST},
    "pallets/itsdangerous": {"language": "python", "setup": "pip install freezegun",
                             "test": PYTEST},
    "python-humanize/humanize": {"language": "python",
                                 "setup": "pip install freezegun && pip install -e .",
                                 "test": PYTEST},
    "python-attrs/attrs": {"language": "python",
                           "setup": "pip install hypothesis && pip install -e .", "test": PYTEST},
    "dtolnay/anyhow": {"language": "rust"},
    "rust-lang/log": {"language": "rust"},
    "tj/commander.js": {"language": "javascript"},
    "chalk/chalk": {"language": "javascript"},
    "expressjs/express": {"language": "javascript"},
}
# projects kept apart: never in bench/plan_fit.py's fit (bench/plan_heldout.toml)
HELD_OUT: dict[str, dict[str, str]] = {
    "pallets/click": {"language": "python"},
    "python-poetry/tomlkit": {"language": "python"},
    "dtolnay/thiserror": {"language": "rust"},
    "sharkdp/hexyl": {"language": "rust"},
    "sindresorhus/ky": {"language": "javascript"},
    "yargs/yargs-parser": {"language": "javascript"},
}
PER_PROJECT = 3
HISTORY = 600


def first_parents(gitdir: Path) -> list[str]:
    out = git(gitdir, "rev-list", "--first-parent", f"--max-count={HISTORY}", "HEAD")
    return list(reversed(out.split()))


def qualifies(gitdir: Path, base: str, commits: list[str]) -> bool:
    changed = [op.path for op in file_changes(gitdir, base, commits[-1])]
    if not 12 <= len(changed) <= 120:
        return False
    parents = [base, *commits[:-1]]
    steps = [file_changes(gitdir, a, b) for a, b in zip(parents, commits, strict=True)]
    groups = gold(steps, changed)
    return len(groups) >= 3 and max(map(len, groups)) <= 0.7 * len(changed)


def choose(repo: str, gitdir: Path) -> list[tuple[str, list[str]]]:
    rng = random.Random(repo)
    line = first_parents(gitdir)
    starts = list(range(1, len(line) - 12))
    rng.shuffle(starts)
    taken: list[tuple[int, int]] = []
    out: list[tuple[str, list[str]]] = []
    for start in starts:
        n = rng.randint(5, 12)
        end = start + n
        if any(start < b and a < end for a, b in taken):
            continue
        if qualifies(gitdir, line[start - 1], line[start:end]):
            taken.append((start - 1, end))
            out.append((line[start - 1], line[start:end]))
            if len(out) == PER_PROJECT:
                break
    return sorted(out, key=lambda item: line.index(item[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors")
    parser.add_argument("--held-out", action="store_true", help="the projects kept apart")
    args = parser.parse_args()
    roots = mirror_roots(args.mirrors)
    kind = "held-out" if args.held_out else "real"
    print(f"# The planner benchmark's {kind} ranges: written by bench/plan_select.py "
          f"{'--held-out ' if args.held_out else ''}(see there).")
    print("# Each is `commits`, first-parent and oldest first, on top of `base`.")
    for repo, info in (HELD_OUT if args.held_out else PROJECTS).items():
        gitdir = find_mirror(repo, roots)
        for index, (base, commits) in enumerate(choose(repo, gitdir), 1):
            r = Range(f"{repo}#{index}", repo, info["language"], base, tuple(commits))
            print(f'\n[[range]]\nrepo = "{r.repo}"\nindex = {index}\n'
                  f'language = "{r.language}"')
            for key in ("setup", "test"):
                if key in info:
                    print(f'{key} = "{info[key]}"')
            print(f'base = "{r.base}"\ncommits = [')
            for c in r.commits:
                print(f'    "{c}",')
            print("]")


if __name__ == "__main__":
    main()
