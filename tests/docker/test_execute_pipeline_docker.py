"""`execute --pipeline` in real containers: the serial run's history, commits and trees with a
fix, and a Ctrl-C while the next commit is being speculated removes its container."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.branches import (
    EXECUTABLE,
    FILE,
    LINK,
    SUBMODULE,
    Tree,
    generated,
    trees,
    write_branch,
)
from tests.commands.test_execute_pipeline import (
    DATES,
    DOCKER,
    reset,
    run,
    speculations,
    stop_while_speculating,
)
from tests.conftest import cli, git, llm_env, make_demo
from tests.docker.conftest import ours
from tests.fake_openai import FakeOpenAI, call
from tests.scripts import by_request


def test_pipelined_run_in_containers_is_the_serial_run_and_a_stop_leaves_nothing(
        engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    serial_spec, serial_branch, serial = run(demo, by_request(), "--no-pipeline", where=DOCKER)
    # the first commit took over the preflight's sandbox, on its tree: none of its own
    assert [e.get("preflight") for e in serial if e["event"] == "sandbox"][:1] == [True]
    reset(demo, original)
    spec, cleaned, events = run(demo, by_request(), "--pipeline", where=DOCKER)
    assert (spec, cleaned) == (serial_spec, serial_branch)
    assert (3, False) in speculations(events) and (4, True) in speculations(events)
    # the kept speculations' containers were opened ahead, not after the commit before
    opened = [e["number"] for e in events if e["event"] == "sandbox"]
    assert opened.count(4) == 1

    reset(demo, original)
    stop_while_speculating(demo, DOCKER)
    assert not ours(engine, tmp_path)  # the speculative container too
    assert demo.git("log", "--format=%s", "main..feature-clean").splitlines() == [
        "feat: discount codes",
        "refactor: move input validation into shop/validation.py"]


# --- every mode gives the serial run's answer ---------------------------------------------------
# Each scenario runs with --no-pipeline, the default (the next commit's sandbox opened ahead)
# and --pipeline (the model extracting ahead too), on one repository reset in between: the
# spec's history, the cleaned branch (commits and trees), the verdicts and the notes must be
# the same. Each tree's test asks git: its HEAD is a tree the run makes, its status is clean.

MODES = {"serial": ("--no-pipeline",), "default": (), "pipeline": ("--pipeline",)}
NOTES = "refs/notes/retcon-sandbox"
# The test command's git checks: HEAD is one of the trees the run makes ($EXPECTED_TREES, when
# given), the index holds HEAD's tree, and the status is clean but for what setup left.
ASKS_GIT = (
    'git --version >/dev/null && h=$(git rev-parse "HEAD^{tree}") && '
    '[ "$h" = "$(git write-tree)" ] && '
    '{ [ -z "${EXPECTED_TREES:-}" ] || case " $EXPECTED_TREES " in *" $h "*) ;; '
    '*) echo "HEAD has the tree $h, not one under test"; exit 1;; esac; } && '
    's=$(git status --porcelain --untracked-files=all | grep -v "^?? made-by-setup.txt$" '
    '|| true) && { [ -z "$s" ] || { echo "git status: $s"; exit 1; }; }')
VERDICTS = ("base_check", "build", "tests", "stuck", "commit_complete", "nothing_to_extract",
            "fix_done")


@dataclass(frozen=True)
class Step:
    """One `execute` of a scenario: the model's answers (None: no model), extra flags, the exit
    code it must give, and what the human does to the spec after it."""

    respond: Callable[[dict[str, Any]], Any] | None = None
    flags: tuple[str, ...] = ()
    code: int = 0
    then: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class Seen:
    """What a scenario left: the spec, the cleaned branch, each run's verdicts, the notes."""

    spec: str
    branch: str
    verdicts: tuple[tuple[Any, ...], ...]
    notes: tuple[tuple[str, str], ...]


def play(root: Path, spec: Path, steps: list[Step], mode: tuple[str, ...],
         env: dict[str, str]) -> tuple[Seen, list[str]]:
    verdicts: list[tuple[Any, ...]] = []
    tags: list[str] = []
    for step in steps:
        flags = ("--non-interactive", "--json", *mode, *step.flags)
        if step.respond is None:
            result = cli("execute", str(spec), *flags, env={**env, **DATES})
        else:
            with FakeOpenAI([], respond=step.respond) as model:
                result = cli("execute", str(spec), *flags,
                             env={**env, **DATES, **llm_env(model.base_url)})
        assert result.code == step.code, (mode, result.out[-3000:] + result.err)
        found = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
        tags += [str(e["tag"]) for e in found if e["event"] == "setup_ready"]
        verdicts += [(e["event"], e.get("number"), e.get("verdict"), e.get("created"))
                     for e in found if e["event"] in VERDICTS]
        if step.then is not None:
            step.then(spec)
    branch = git(root, "log", "--format=%H %T %B", "main..feature-clean")
    return Seen(spec.read_text(), branch, tuple(verdicts), notes(root)), tags


def notes(root: Path) -> tuple[tuple[str, str], ...]:
    """Each tree's note, without what differs from run to run (times, seconds, HMACs)."""
    listed = git(root, "notes", f"--ref={NOTES}", "list") if git(
        root, "for-each-ref", NOTES) else ""
    found = []
    for line in listed.splitlines():
        blob, tree = line.split()
        records = [json.loads(r) for r in git(root, "cat-file", "-p", blob).splitlines()]
        for record in records:
            for name in ("at", "mac"):
                record.pop(name, None)
            for stage in record["stages"]:
                stage.pop("seconds")
        text = re.sub(r"\d+\.\d+ ?s\b", "Ns", json.dumps(records, sort_keys=True))
        found.append((tree, text))
    return tuple(sorted(found))


def differential(root: Path, spec: Path, steps: list[Step], env: dict[str, str] | None = None
                 ) -> Seen:
    """The scenario in every mode, from the same start: the serial run's result, which every
    mode gave too."""
    original = spec.read_text()
    seen: dict[str, Seen] = {}
    tags: list[str] = []
    try:
        for name, mode in MODES.items():
            if git(root, "branch", "--list", "feature-clean"):
                git(root, "branch", "-D", "feature-clean")
            if git(root, "for-each-ref", NOTES):
                git(root, "update-ref", "-d", NOTES)
            spec.write_text(original)
            seen[name], made = play(root, spec, steps, mode, env or {})
            tags += made
    finally:
        engine = DockerEngine()
        for tag in set(tags):
            if engine.has_image(tag):
                engine.remove_image(tag)
    for name in MODES:
        assert seen[name] == seen["serial"], (name, _difference(seen[name], seen["serial"]))
    return seen["serial"]


def _difference(got: Seen, serial: Seen) -> str:
    return "\n".join(f"{field}:\n  {getattr(got, field)!r}\n  serial: {getattr(serial, field)!r}"
                     for field in ("spec", "branch", "verdicts", "notes")
                     if getattr(got, field) != getattr(serial, field))[:6000]


PATHS_SANDBOX = f"""\
setup = ["echo from-setup > made-by-setup.txt"]
test = '''sh check.sh && {ASKS_GIT}'''
"""
CHECK = "set -e\n[ -f made-by-setup.txt ] || [ ! -e need-setup ]\n"
SUB_A, SUB_B = "1" * 40, "2" * 40


def paths_scenario() -> tuple[Tree, list[Tree]]:
    """Every kind of change a `paths` commit makes in a sandbox opened ahead: adds, a rename, a
    mode change, type changes (symlink to file, folder to symlink, symlink to folder, file to
    folder), deletions that empty folders, edits, submodules bumped, added and removed."""
    base: Tree = {"check.sh": (FILE, CHECK), "need-setup": (FILE, "\n"),
                  "README.md": (FILE, "# r\n"), "run.sh": (EXECUTABLE, "#!/bin/sh\n"),
                  "target.txt": (FILE, "t\n"), "link": (LINK, "target.txt"),
                  "conf/a.ini": (FILE, "a\n"), "real/x": (FILE, "x\n"), "linked": (LINK, "real"),
                  "was_file": (FILE, "f\n"), "legacy/deep/old.py": (FILE, "OLD = 1\n"),
                  "sub": (SUBMODULE, SUB_A), "vendor/lib": (SUBMODULE, SUB_A)}
    one = {**base, "one.txt": (FILE, "one\n"), "docs/README.md": base["README.md"],
           "run.sh": (FILE, "#!/bin/sh\n")}
    del one["README.md"]
    two = {k: v for k, v in one.items()
           if k not in ("link", "linked", "was_file", "conf/a.ini", "legacy/deep/old.py",
                        "vendor/lib")}
    two.update({"link": (FILE, "now a file\n"), "linked/x": (FILE, "x\n"),
                "was_file/y": (FILE, "y\n"), "conf": (LINK, "real"), "sub": (SUBMODULE, SUB_B)})
    three = {k: v for k, v in two.items() if k != "real/x"}
    three.update({"new/deep/file.txt": (FILE, "new\n"), "one.txt": (FILE, "one, edited\n"),
                  "third/sub": (SUBMODULE, SUB_A)})
    return base, [one, two, three]


def test_paths_commits_with_setup_and_git_metadata_are_the_same_in_every_mode(
        engine: DockerEngine, tmp_path: Path) -> None:
    base, commits = paths_scenario()
    root = tmp_path / "repo"
    spec = write_branch(root, base, commits, PATHS_SANDBOX, tag="v0.1")
    expected = trees(root, "expected")
    seen = differential(root, spec, [Step(flags=("--pass-env", "EXPECTED_TREES",
                                                 "--setup-network", "none",
                                                 "--no-package-cache"))],
                        env={"EXPECTED_TREES": " ".join(expected)})
    assert trees(root, "feature-clean") == expected
    assert [v for v in seen.verdicts if v[0] == "tests"] == [
        ("tests", n, "PASS", None) for n in (1, 2, 3)]
    assert len(seen.notes) == 3  # each commit's tree (the base runs only when commit 1 fails)
    assert not ours(engine, tmp_path)


STOP = "commit 3 needs commit 2's fix first"
GO_ON = "Commit 2 is in: go on."  # the human's note after commit 3 is stuck
# the build leaves __pycache__ folders, as in any sandbox: not files of the tree
DEMO_TEST = ASKS_GIT.replace("=all", "=no") + " && python3 -m pytest -q -p no:cacheprovider"


def stuck_at_3_until_resolved() -> Callable[[dict[str, Any]], Any]:
    """The demo's answers (commit 2 needs a fix), but commit 3 is reported stuck until the
    human's note is in its task."""
    answer = by_request(needs_fix=True)

    def respond(body: dict[str, Any]) -> Any:
        task = str(body["messages"][1]["content"])
        if task.startswith("Commit 3 of") and GO_ON not in task:
            return [call("report_stuck", summary=STOP)]
        return answer(body)

    return respond


def resolve(spec: Path) -> None:
    text = spec.read_text()
    marked = re.sub(r'(\{ stuck = "' + re.escape(STOP) + r'" \},\n)', lambda m: m.group(1) +
                    f'    {{ resolved = "{GO_ON}" }},\n', text, count=1)
    assert marked != text, text
    spec.write_text(marked)


def test_a_model_with_a_fix_a_stop_a_resume_and_a_squash_is_the_same_in_every_mode(
        engine: DockerEngine, tmp_path: Path) -> None:
    """The model extracts (ahead, with --pipeline), commit 2 needs a fix, commit 3 stops
    stuck; after the human's note the run resumes, and --squash-wip folds the fix in (each
    squashed tree verified again, in refilled sandboxes)."""
    demo = make_demo(tmp_path / "repo", with_paths=False)
    respond = stuck_at_3_until_resolved()
    seen = differential(demo.path, demo.spec, [
        Step(respond, ("--test", DEMO_TEST), code=3, then=resolve),
        Step(respond, ("--test", DEMO_TEST, "--squash-wip"))])
    assert "fixup! feat: discount codes" not in seen.branch  # squashed
    assert ("stuck", 3, None, None) in seen.verdicts
    tests = [v for v in seen.verdicts if v[0] == "tests"]
    assert tests and all(v[2] == "PASS" or v[1] == 2 for v in tests), seen.verdicts
    assert not ours(engine, tmp_path)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_generated_branch_is_the_same_in_every_mode(engine: DockerEngine, tmp_path: Path,
                                                     seed: int) -> None:
    """Random adds, deletes, renames, mode and type changes (submodules too) over four
    commits, each a `paths` commit whose tree's test asks git."""
    base, commits = generated(seed, 4, "set -e\n")
    root = tmp_path / "repo"
    spec = write_branch(root, base, commits, f"test = '''{ASKS_GIT}'''")
    expected = trees(root, "expected")
    seen = differential(root, spec, [Step(flags=("--pass-env", "EXPECTED_TREES"))],
                        env={"EXPECTED_TREES": " ".join(expected)})
    assert trees(root, "feature-clean") == expected
    assert [v[2] for v in seen.verdicts if v[0] == "tests"] == ["PASS"] * (len(expected) - 1)
    assert not ours(engine, tmp_path)
