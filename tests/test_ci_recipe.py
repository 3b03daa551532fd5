"""The GitHub Actions recipe (docs/ci/github-actions.yml, shown verbatim in docs/verify.md).

GitHub's JSON schema (schemastore) cannot be reached from here, so this checks the workflow's
structure (actionlint checks it too: tests/test_ci_recipe_lint.py): what a run needs. The
triggers and jobs. Steps that are either `uses` or `run`. Write permission for the push. Every
retcon-sandbox command line accepted by our own parser. A pinned install. The sandbox images
cached under their tags. The job summary and the report. Every uploaded artifact made by an
earlier step (or in the checkout), and outside hidden folders, which upload-artifact skips. And
its notes push, run for real against a remote another run pushed to meanwhile."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from retcon_sandbox import __version__
from retcon_sandbox.backends.docker.sandboximages import CATALOG
from retcon_sandbox.cli import parser
from retcon_sandbox.errors import UsageError
from retcon_sandbox.spec.statedir import StateDir
from retcon_sandbox.verify.cache import REF
from tests.conftest import ROOT, cli, git

WORKFLOW = ROOT / "docs" / "ci" / "github-actions.yml"
TOP = {"name", "run-name", "on", "permissions", "env", "defaults", "concurrency", "jobs"}
JOB = {"name", "runs-on", "permissions", "needs", "if", "environment", "concurrency", "outputs",
       "env", "defaults", "steps", "timeout-minutes", "strategy", "continue-on-error",
       "container", "services"}
STEP = {"id", "if", "name", "uses", "run", "with", "env", "shell", "working-directory",
        "continue-on-error", "timeout-minutes"}
EVENTS = {"workflow_dispatch", "push", "pull_request", "schedule", "workflow_call"}
USES = r"[\w.-]+/[\w.-]+(/[\w.-]+)*@v\d+(\.\d+)*"  # an action (or one of its sub-actions)


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
                assert re.fullmatch(USES, step["uses"]), step
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
            made.update(re.findall(r"(?:^|\s)-o\s+([\w./-]+)", line))
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
    assert {"events.jsonl", "junit.xml", "report.html", "transcripts"} <= \
        {p.rstrip("/") for p in paths}


def test_the_copy_step_finds_the_transcripts_where_a_run_writes_them(tmp_path: Path) -> None:
    (copy,) = [r for r in runs() if "transcript" in r]
    (source,) = [w for w in shlex.split(copy) if w.startswith(".git/")]
    git_dir = tmp_path / "repo" / ".git"
    git_dir.mkdir(parents=True)
    written = StateDir(git_dir).transcript_path(tmp_path / "repo" / "history-spec.toml")
    relative = written.relative_to(tmp_path / "repo").as_posix()
    assert fnmatch.fnmatch(relative, source), (relative, source)
    assert copy.startswith("mkdir -p transcripts") and "transcripts/" in copy


# --- what a maintainer copies: a pinned install, cached images, the summary and the report ----


PINNED = r"git\+https://github\.com/OWNER/retcon-sandbox@(v{version}|[0-9a-f]{{40}})"


def check_pinned_install(data: dict[str, Any]) -> None:
    """Every job installs retcon-sandbox from the workflow's one pinned source: a release tag
    of this version or a full commit sha, never a branch."""
    source = data["env"]["RETCON_SANDBOX_FROM"]
    assert re.fullmatch(PINNED.format(version=re.escape(__version__)), source), source
    for job in data["jobs"].values():
        for step in job["steps"]:
            for line in step.get("run", "").splitlines():
                if "pip install" in line:
                    assert line.strip() == 'pip install "$RETCON_SANDBOX_FROM"', line


def test_the_install_is_pinned_to_a_release_or_a_commit() -> None:
    check_pinned_install(load())


def image_steps(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The steps of the image cache, by what they do."""
    found: dict[str, dict[str, Any]] = {}
    for step in job["steps"]:
        run, uses = step.get("run", ""), step.get("uses", "")
        if "retcon-sandbox images tag" in run:
            found["key"] = step
        elif uses.startswith("actions/cache"):
            found["cache"] = step
        elif "docker load" in run:
            found["load"] = step
        elif "retcon-sandbox images build" in run:
            found["build"] = step
        if "docker save" in run:
            found["save"] = step
    return found


def test_the_sandbox_images_are_cached_under_their_tags(tmp_path: Path) -> None:
    (job,) = load()["jobs"].values()
    found = image_steps(job)
    assert set(found) == {"key", "cache", "load", "build", "save"}
    order = [job["steps"].index(found[k]) for k in ("key", "cache", "load", "build", "save")]
    assert order == sorted(order)
    cache_id = found["cache"]["id"]
    assert found["cache"]["with"]["key"] == f"${{{{ steps.{found['key']['id']}.outputs.key }}}}"
    assert found["load"]["if"] == f"steps.{cache_id}.outputs.cache-hit == 'true'"
    assert found["save"]["if"] == f"steps.{cache_id}.outputs.cache-hit != 'true'"
    # the key step's shell, run for real: the tags `images tag` prints, and a key made of them
    output = tmp_path / "output"
    bash(found["key"]["run"], tmp_path, {**os.environ, "GITHUB_OUTPUT": str(output),
                                        "IMAGES": "base rust"})
    values = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert values["tags"] == f"{CATALOG['base'].tag} {CATALOG['rust'].tag}"
    assert re.fullmatch(r"retcon-images-[0-9a-f]{32}", values["key"])


def test_the_run_writes_the_job_summary_and_the_report() -> None:
    commands = {shlex.split(r)[1]: r for r in runs() if r.startswith("retcon-sandbox ")}
    for command in ("execute", "verify"):
        assert '--summary "$GITHUB_STEP_SUMMARY"' in commands[command], command
    (report,) = [s for s in steps() if s.get("run", "").startswith("retcon-sandbox report ")]
    assert report["if"] == "always()" and "-o report.html" in report["run"]


def bash(script: str, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, f"{script}\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_notes_push_merges_what_another_run_pushed_meanwhile(tmp_path: Path) -> None:
    """Two runs verify different commits of one branch; the first pushes its notes; the
    second's push is refused (the ref moved), so the recipe's step fetches, merges with
    cat_sort_uniq and pushes again: the remote then holds both runs' results."""
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    for i in range(4):
        (origin / "a").write_text(f"{i}\n")
        git(origin, "add", "-A")
        git(origin, "commit", "-qm", f"c{i}")
    git(origin, "branch", "feature-clean")
    git(origin, "checkout", "-q", "--detach")  # the branch can be pushed to
    key = {"RETCON_SANDBOX_NOTES_KEY": "the-secret-both-runs-share-0123456789abcdef"}
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sleep").write_text("#!/bin/sh\nexit 0\n")  # no waiting between attempts here
    (shim / "sleep").chmod(0o755)
    env = {**os.environ, **key, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    (push,) = [r for r in runs() if "git push" in r]
    clones = []
    for name, rev in (("first", "feature-clean~3..feature-clean~1"),
                      ("second", "feature-clean~1..feature-clean")):
        work = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(origin), str(work)], check=True)
        git(work, "branch", "-f", "feature-clean", "origin/feature-clean")
        done = cli("verify", rev, "--repo", str(work), "--sandbox", "local", "--build", "true",
                   "--test", "true", env=key)
        assert done.code == 0, done.out + done.err
        clones.append(work)
    bash(push, clones[0], env)
    said = bash(push, clones[1], env)
    assert "rejected" in said or "fetch first" in said  # it did meet the first run's push
    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(origin), str(fresh)], check=True)
    git(fresh, "fetch", "-q", "origin", f"{REF}:{REF}")
    after = cli("verify", "origin/feature-clean~3..origin/feature-clean", "--repo", str(fresh),
                "--sandbox", "local", "--build", "true", "--test", "true", "--json", env=key)
    assert after.code == 0, after.out + after.err
    verified = [e for e in map(json.loads, after.out.splitlines())
                if e["event"] == "commit_verified"]
    assert len(verified) == 3 and all(e["cached"] for e in verified)
