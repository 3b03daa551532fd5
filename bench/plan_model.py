"""What `plan --model`'s refinement changes on the benchmark, with the project's scripted model
(tests/fake_openai.py) standing in for one: the draft alone, beside the spec `plan` writes when
the model proposes (a) the draft itself, (b) one commit per top-level folder, (c) the gold plan.

    python3 bench/plan_model.py [--mirrors DIR] [--mode sequential] [--only TEXT]

For each it prints the ARI against gold and what the code had to repair in the proposal (files
left out, named twice, not in the diff), and checks that every changed file is in exactly one
commit. A real model is not measured here: it needs an endpoint and a key this machine has not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fake_openai
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))  # this checkout's
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realhistory import (
    MODES,
    build,
    find_mirror,
    gold,
    load_ranges,
    messify,
    mirror_roots,
    real_steps,
)

from retcon_sandbox.plan.score import score
from tests.fake_openai import Call, FakeOpenAI, Step, call

Policy = Callable[[str], list[tuple[str, list[str]]]]


def section(task: str, title: str) -> list[str]:
    lines = task.split("\n")
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("  ")),
               len(lines))
    return [line[2:] for line in lines[start:end]]


def drafted(task: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in section(task, "Draft plan:"):
        head, _, files = line.partition(". ")[2].rpartition(": ")  # `N. message: a, b`
        out.append((head, files.split(", ")))
    return out


def folders(task: str) -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for line in section(task, "Changed files:"):
        path = line.split(" ", 1)[1]
        groups.setdefault(path.split("/")[0] if "/" in path else ".", []).append(path)
    return [(f"Change {top}", paths) for top, paths in groups.items()]


def model(policy: Policy) -> Callable[[dict[str, Any]], Step]:
    def respond(body: dict[str, Any]) -> Step:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return [call("finish_plan")]
        task = body["messages"][1]["content"]
        calls: list[Call] = [call("propose_commit", message=m, paths=p) for m, p in policy(task)]
        return calls
    return respond


def plan(repo: Path, respond: Callable[[dict[str, Any]], Step] | None) -> tuple[list[list[str]],
                                                                               str]:
    env = dict(os.environ)
    args = [sys.executable, "-m", "retcon_sandbox", "plan", "--source", "feature", "--remote",
            "main", "--json"]
    with FakeOpenAI([], respond=respond) as fake:
        if respond is not None:
            env.update({"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "bench",
                        "RETCON_SANDBOX_MODEL": "scripted"})
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True,
                              check=False, stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    written = next((e for e in events if e["event"] == "plan_written"), None)
    if done.returncode != 0 or written is None:
        return [], f"plan failed: {done.stderr.strip()[:200]}"
    warnings = "; ".join(e["message"] for e in events if e["event"] == "warning")
    return [e["paths"] for e in events if e["event"] == "plan_commit"], warnings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors")
    parser.add_argument("--mode", choices=MODES, action="append")
    parser.add_argument("--only")
    args = parser.parse_args()
    roots = mirror_roots(args.mirrors)
    policies: dict[str, Policy | None] = {"draft alone": None, "model echoes the draft": drafted,
                                          "model proposes folders": folders}
    results: dict[str, list[float]] = {name: [] for name in [*policies, "model proposes gold"]}
    repaired: dict[str, int] = dict.fromkeys(results, 0)
    exact: dict[str, int] = dict.fromkeys(results, 0)
    with tempfile.TemporaryDirectory(prefix="retcon-bench-model-") as tmp:
        for r in load_ranges():
            if args.only and args.only not in r.name:
                continue
            mirror = find_mirror(r.repo, roots)
            for mode in args.mode or MODES:
                repo = build(Path(tmp) / f"{r.name.replace('/', '+')}-{mode}", mirror, r,
                             messify(mirror, r, mode))
                listed = subprocess.run(["git", "-C", str(repo), "diff", "--no-renames", "-z",
                                         "--name-only", "main", "feature"],
                                        capture_output=True, text=True, check=True).stdout
                changed = sorted(p for p in listed.split("\0") if p)
                truth = gold(real_steps(mirror, r), changed)
                answers = {**policies, "model proposes gold": lambda _t, g=truth: [
                    (f"Commit {i}", files) for i, files in enumerate(g, 1)]}
                for name, policy in answers.items():
                    groups, warnings = plan(repo, model(policy) if policy else None)
                    results[name].append(score(groups, truth).ari)
                    repaired[name] += "repaired" in warnings or "refused" in warnings
                    exact[name] += sorted(p for g in groups for p in g) == changed
    print("| | mean ARI | drafts with a repair or refusal | every file exactly once |")
    print("|---|---:|---:|---:|")
    for name, values in results.items():
        print(f"| {name} | {mean(values):.3f} | {repaired[name]} of {len(values)} | "
              f"{exact[name]} of {len(values)} |")
    print("\nA real model is untested here: these are the code's checks around one.")


if __name__ == "__main__":
    main()
