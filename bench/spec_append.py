"""What one history append costs on a very large spec, side by side with parsing it whole.

    python3 bench/spec_append.py [--commits 15000] [--repeat 5] [--entries 500]

Writes a spec of COMMITS finished commits (about 50 MB with the default), loads it once as a run
does, then times: one append as the run makes it (re-read, compare, splice, check the changed
table, atomic write with fsync); a full parse with tomllib, which an append no longer needs; and,
if tomlkit is installed, a parse and dumps with it (how saves were made before: the whole
document re-serialised). Then, side by side on a spec of ENTRIES history entries, one append
as we make it against the same append made with tomlkit (parse, append to the array, dumps, the
same atomic write). Nothing is asserted (but that both wrote the same document): these are
figures to read.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from retcon_sandbox.spec.file import SpecFile, atomic_write
from retcon_sandbox.spec.history import CommitCreated, Complete, Entry, kind_of, value_of

HINTS = "Move the helpers of this module and their callers; keep the tests for later. " * 40


def spec_text(commits: int) -> str:
    parts = ['source = "feature"\nremote = "main"\ncleaned = "feature-clean"\n']
    for n in range(1, commits + 1):
        done = n < commits
        history = (f'    "started",\n    {{ commit_created = "{n:040x}" }},\n    "complete",\n'
                   if done else '    "started",\n')
        parts.append(f'\n[[commit]]\nmessage = """feat: step {n}\n\nBody of step {n}."""\n'
                     f'hints = """{HINTS}"""\nhistory = [\n{history}]\n')
    return "".join(parts)


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def line(label: str, seconds: float | None, note: str = "") -> None:
    shown = f"{seconds * 1000:10.1f} ms" if seconds is not None else "           -"
    print(f"  {label:<44}{shown}  {note}")


def side_by_side(entries: int, repeat: int) -> None:
    """Per append, on a spec of `entries` history entries: our splice, and tomlkit's."""
    try:
        tomlkit = importlib.import_module("tomlkit")
    except ImportError:
        print("\nside by side: tomlkit is not installed")
        return
    commits = max(1, (entries + 2) // 3)  # three entries for each finished commit
    with tempfile.TemporaryDirectory(prefix="retcon-bench-") as tmp:
        ours, theirs = Path(tmp) / "ours.toml", Path(tmp) / "tomlkit.toml"
        ours.write_text(spec_text(commits))
        theirs.write_text(spec_text(commits))
        specfile = SpecFile(ours)
        state = {"commit": specfile.load().commits[-1]}
        pair: list[Entry] = [CommitCreated("f" * 40), Complete()]
        mine, other = iter(pair * repeat), iter(pair * repeat)

        def append() -> None:
            _, state["commit"] = specfile.append(state["commit"], next(mine))

        def append_with_tomlkit() -> None:
            doc = tomlkit.parse(theirs.read_text())
            entry = next(other)
            kind = kind_of(entry)
            doc["commit"][-1]["history"].append(
                kind.key if kind.bare else tomlkit.inline_table().add(kind.key, value_of(entry)))
            atomic_write(theirs, tomlkit.dumps(doc).encode())

        mine_s, theirs_s = timed(append, repeat), timed(append_with_tomlkit, repeat)
        assert tomllib.loads(ours.read_text()) == tomllib.loads(theirs.read_text())
        size = ours.stat().st_size
        print(f"\nside by side: one append to a spec of {entries} history entries "
              f"({commits} commits, {size / 1e3:.0f} kB; median of {repeat})")
        line("our splice (re-read, splice, check, write)", mine_s)
        line("tomlkit (parse, append, dumps, write)", theirs_s,
             f"{theirs_s / mine_s:,.0f}x slower")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=15_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--entries", type=int, default=500)
    args = parser.parse_args()
    side_by_side(args.entries, args.repeat)
    with tempfile.TemporaryDirectory(prefix="retcon-bench-") as tmp:
        path = Path(tmp) / "spec.toml"
        text = spec_text(args.commits)
        path.write_text(text)
        size = path.stat().st_size
        print(f"spec: {args.commits} commits, {size / 1e6:.1f} MB (median of {args.repeat})")

        specfile = SpecFile(path)
        start = time.perf_counter()
        commit = specfile.load().commits[-1]
        first_load = time.perf_counter() - start

        pair: list[Entry] = [CommitCreated("f" * 40), Complete()]
        entries = iter(pair * args.repeat)
        state = {"commit": commit}

        def append() -> None:
            _, state["commit"] = specfile.append(state["commit"], next(entries))

        one_append = timed(append, args.repeat)
        current = path.read_text()
        full_parse = timed(lambda: tomllib.loads(current), args.repeat)
        line("first load (full parse, validation, scan)", first_load, "once per run")
        line("one append (what each history entry costs)", one_append)
        line("full parse with tomllib", full_parse, "what an append avoids")
        try:
            tomlkit = importlib.import_module("tomlkit")
        except ImportError:
            line("tomlkit parse + dumps (the old save)", None, "tomlkit is not installed")
            return
        old_save = timed(lambda: tomlkit.dumps(tomlkit.parse(current)), 1)
        line("tomlkit parse + dumps (the old save)", old_save, "once, not the median")
        print(f"\n  one append is {old_save / one_append:,.0f}x faster than the old save")


if __name__ == "__main__":
    main()
