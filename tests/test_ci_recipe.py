"""The GitHub Actions recipe (docs/ci/github-actions.yml, shown verbatim in docs/verify.md).

GitHub's JSON schema (schemastore) cannot be reached from here, so this checks the workflow's
structure: what a run needs. The triggers and jobs. Steps that are either `uses` or `run`.
Write permission for the push. Every retcon-sandbox command line accepted by our own parser.
Every uploaded artifact made by an earlier step (or in the checkout), and outside hidden
folders, which upload-artifact skips."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from retcon_sandbox.cli import parser
from retcon_sandbox.errors import UsageError
from retcon_sandbox.spec.statedir import StateDir
from tests.conftest import ROOT

WORKFLOW = ROOT / "docs" / "ci" / "github-actions.yml"
TOP = {"name", "run-name", "on", "permissions", "env", "defaults", "concurrency", "jobs"}
JOB = {"name", "runs-on", "permissions", "needs", "if", "environment", "concurrency", "outputs",
       "env", "defaults", "steps", "timeout-minutes", "strategy", "continue-on-error",
       "container", "services"}
STEP = {"id", "if", "name", "uses", "run", "with", "env", "shell", "working-directory",
        "continue-on-error", "timeout-minutes"}
EVENTS = {"workflow_dispatch", "push", "pull_request", "schedule", "workflow_call"}


def load(workflow: Path = WORKFLOW) -> dict[str, Any]:
    data = yaml.safe_load(workflow.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def steps() -> list[dict[str, Any]]:
    (job,) = load()["jobs"].values()
    found = job["steps"]
    assert isinstance(found, list)
    return found


def runs() -> list[str]:
    return [s["run"] for s in steps() if "run" in s]


def test_the_verify_page_shows_the_workflow_verbatim() -> None:
    page = (ROOT / "docs" / "verify.md").read_text(encoding="utf-8")
    section = page.split("\n## Use in CI\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert blocks == [WORKFLOW.read_text(encoding="utf-8")]


def test_the_workflow_has_the_shape_github_accepts() -> None:
    data = load()
    assert set(data) <= TOP and {"on", "jobs"} <= set(data)
    on = data["on"]
    assert set([on] if isinstance(on, str) else on) <= EVENTS
    assert data["permissions"] == {"contents": "write"}  # the push needs it
    for name, job in data["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name)
        assert set(job) <= JOB and isinstance(job["runs-on"], str)
        assert all(isinstance(v, str) for v in (job.get("env") or {}).values())
        assert job["steps"]
        for step in job["steps"]:
            assert set(step) <= STEP, step
            assert ("uses" in step) != ("run" in step), step  # exactly one
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+(\.\d+)*", step["uses"]), step
            else:
                assert "with" not in step and isinstance(step["run"], str)


def test_the_notes_key_has_its_place() -> None:
    (job,) = load()["jobs"].values()
    assert "env" in job
    text = WORKFLOW.read_text(encoding="utf-8")
    env_block = text.split("    env:\n", 1)[1].split("    steps:\n", 1)[0]
    assert "RETCON_SANDBOX_NOTES_KEY" in env_block


def test_every_retcon_sandbox_command_is_one_the_cli_accepts() -> None:
    commands = [r.split(">", 1)[0] for r in runs() if r.startswith("retcon-sandbox ")]
    assert len(commands) >= 3
    for command in commands:
        try:
            args = parser().parse_args(shlex.split(command)[1:])
        except (UsageError, SystemExit) as exc:
            pytest.fail(f"{command}: {exc}")
        if args.command == "execute":
            assert args.non_interactive and args.json


def made_by_steps(before: list[dict[str, Any]]) -> set[str]:
    """The files and folders the `run` steps before an upload write."""
    made: set[str] = set()
    for step in before:
        for line in step.get("run", "").splitlines():
            made.update(re.findall(r">\s*([\w./-]+)", line))
            made.update(re.findall(r"--junit\s+([\w./-]+)", line))
            made.update(re.findall(r"mkdir -p\s+([\w./-]+)", line))
    return {m.rstrip("/") for m in made}


def test_every_uploaded_path_is_made_first_and_visible(tmp_path: Path) -> None:
    all_steps = steps()
    (at,) = [i for i, s in enumerate(all_steps) if s.get("uses", "").startswith(
        "actions/upload-artifact@")]
    upload = all_steps[at]
    assert upload["if"] == "always()"  # a stuck run (exit 3) is when the files matter
    paths = [p.strip() for p in upload["with"]["path"].splitlines() if p.strip()]
    made = made_by_steps(all_steps[:at])
    in_checkout = {"history-spec.toml"}  # the spec the user commits
    for path in paths:
        assert path.rstrip("/") in made | in_checkout, path
        hidden = any(part.startswith(".") for part in Path(path).parts)
        assert not hidden or upload["with"].get("include-hidden-files") is True, path
    assert {"events.jsonl", "junit.xml", "transcripts"} <= {p.rstrip("/") for p in paths}


def test_the_copy_step_finds_the_transcripts_where_a_run_writes_them(tmp_path: Path) -> None:
    (copy,) = [r for r in runs() if "transcript" in r]
    (source,) = [w for w in shlex.split(copy) if w.startswith(".git/")]
    git_dir = tmp_path / "repo" / ".git"
    git_dir.mkdir(parents=True)
    written = StateDir(git_dir).transcript_path(tmp_path / "repo" / "history-spec.toml")
    relative = written.relative_to(tmp_path / "repo").as_posix()
    assert fnmatch.fnmatch(relative, source), (relative, source)
    assert copy.startswith("mkdir -p transcripts") and "transcripts/" in copy
