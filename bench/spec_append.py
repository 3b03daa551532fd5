"""What one history append costs on a very large spec, side by side with parsing it whole.

    python3 bench/spec_append.py [--commits 15000] [--repeat 5]

Writes a spec of COMMITS finished commits (about 50 MB with the default), loads it once as a run
does, then times: one append as the run makes it (re-read, compare, splice, check the changed
table, atomic write with fsync); a full parse with tomllib, which an append no longer needs; and,
if tomlkit is installed, a parse and dumps with it (how saves were made before: the whole
document re-serialised). Nothing is asserted: these are figures to read.
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

from retcon_sandbox.spec.file import SpecFile
from retcon_sandbox.spec.history import CommitCreated, Complete, Entry

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=15_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
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
