"""The sharded GitHub Actions recipe (docs/ci/github-actions-shards.yml, shown in
docs/scaling.md): a structural check of the workflow, as tests/test_ci_recipe.py does for the
single-job one (the images built once, by a job of their own, for every shard), and its own
shell steps run for real: four shard jobs in four clones push their notes with the recipe's
push step, the recipe's merge job merges and pushes them and writes the report, and `verify` in
a fresh clone then finds every tree cached. (GitHub itself does not run here: `${{ }}`
expressions are substituted by the test, the local backend stands in for Docker, and the
installed retcon-sandbox for the recipe's install.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.cli import parser
from retcon_sandbox.errors import UsageError
from retcon_sandbox.verify.cache import REF
from tests.conftest import ROOT, cli, git
from tests.test_ci_recipe import (
    EVENTS,
    JOB,
    STEP,
    TOP,
    USES,
    check_pinned_install,
    image_steps,
)
from tests.test_ci_recipe import load as load_workflow

WORKFLOW = ROOT / "docs" / "ci" / "github-actions-shards.yml"
RUN_ID = "4242"


def load() -> dict[str, Any]:
    return load_workflow(WORKFLOW)


def matrix() -> list[int]:
    shards = load()["jobs"]["verify"]["strategy"]["matrix"]["shard"]
    assert isinstance(shards, list)
    return shards


def expand(text: str, shard: int | None = None) -> str:
    """The `${{ }}` expressions the recipe uses, as GitHub would fill them in."""
    text = text.replace("${{ github.run_id }}", RUN_ID)
    if shard is not None:
        text = text.replace("${{ matrix.shard }}", str(shard))
    text = text.replace("${{ secrets.RETCON_SANDBOX_NOTES_KEY }}", "secret")
    assert "${{" not in text, text
    return text


def test_the_workflow_has_the_shape_github_accepts() -> None:
    data = load()
    assert set(data) <= TOP and {"on", "jobs"} <= set(data)
    on = data["on"]
    assert set([on] if isinstance(on, str) else on) <= EVENTS
    assert data["permissions"] == {"contents": "write"}  # the notes are pushed
    assert set(data["jobs"]) == {"images", "verify", "merge-notes"}
    for name, job in data["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name)
        assert set(job) <= JOB and isinstance(job["runs-on"], str)
        assert all(isinstance(v, str) for v in (job.get("env") or {}).values())
        for step in job["steps"]:
            assert set(step) <= STEP, step
            assert ("uses" in step) != ("run" in step), step
            if "uses" in step:
                assert re.fullmatch(USES, step["uses"]), step
            else:
                assert "with" not in step and isinstance(step["run"], str)


def test_the_matrix_covers_every_shard_once_and_each_job_verifies_its_own() -> None:
    data = load()
    job = data["jobs"]["verify"]
    assert job["strategy"]["fail-fast"] is False  # a failing shard must not cancel the others
    shards = matrix()
    assert shards == list(range(1, len(shards) + 1)) and len(shards) >= 2
    (command,) = [s["run"] for s in job["steps"] if s.get("run", "").startswith(
        "retcon-sandbox verify")]
    for k in shards:
        words = shlex.split(expand(command, k).replace('"$RANGE"', data["env"]["RANGE"]))
        try:
            args = parser().parse_args(words[1:])
        except (UsageError, SystemExit) as exc:
            pytest.fail(f"{command}: {exc}")
        assert (args.shard.k, args.shard.n) == (k, len(shards))
        assert args.junit == f"junit-{k}.xml"
    assert "RETCON_SANDBOX_NOTES_KEY" in job["env"]  # every job authenticates with one key


def test_the_merge_job_waits_for_every_shard_and_merges_without_conflicts() -> None:
    merge = load()["jobs"]["merge-notes"]
    assert merge["needs"] == "verify" and merge["if"] == "always()"
    script = "\n".join(s["run"] for s in merge["steps"] if "run" in s)
    assert "merge -s cat_sort_uniq" in script
    pushes = [s for s in load()["jobs"]["verify"]["steps"] if "git push" in s.get("run", "")]
    assert len(pushes) == 1 and pushes[0]["if"] == "always()"  # failures are kept too


def test_the_images_are_built_once_for_every_shard() -> None:
    data = load()
    images, verify = data["jobs"]["images"], data["jobs"]["verify"]
    found = image_steps(images)
    assert set(found) == {"key", "cache", "build", "save"} and found["build"] is found["save"]
    assert images["outputs"]["key"] == f"${{{{ steps.{found['key']['id']}.outputs.key }}}}"
    assert found["build"]["if"] == f"steps.{found['cache']['id']}.outputs.cache-hit != 'true'"
    assert "strategy" not in images  # one job, whatever the matrix
    assert verify["needs"] == "images"
    shard = image_steps(verify)
    assert set(shard) == {"cache", "load"}  # no shard builds
    assert shard["cache"]["uses"].startswith("actions/cache/restore@")
    assert shard["cache"]["with"] == {**found["cache"]["with"], "fail-on-cache-miss": True,
                                      "key": "${{ needs.images.outputs.key }}"}
    check_pinned_install(data)


def test_each_shard_writes_a_summary_and_the_merge_job_the_report() -> None:
    (command,) = [r for r in steps_of("verify") if r.startswith("retcon-sandbox verify")]
    assert '--summary "$GITHUB_STEP_SUMMARY"' in command
    (report,) = [r for r in steps_of("merge-notes") if "retcon-sandbox report" in r]
    assert '--range "$RANGE"' in report and "-o report.html" in report
    uploads = [s for s in load()["jobs"]["merge-notes"]["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert [u["with"]["path"] for u in uploads] == ["report.html"]


SPEC = """\
source = "feature-clean"
remote = "main"
cleaned = "feature-cleaner"

[sandbox]
build = "true"
test = "true"

[[commit]]
message = "Everything"
paths = ["*"]
"""


def steps_of(job: str) -> list[str]:
    return [s["run"] for s in load()["jobs"][job]["steps"] if "run" in s]


def bash(script: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, f"{script}\n{proc.stdout}{proc.stderr}"


@pytest.mark.slow
def test_the_recipes_push_and_merge_steps_leave_every_tree_cached(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    (origin / "a").write_text("0\n")
    (origin / "history-spec.toml").write_text(SPEC)
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "base")
    git(origin, "checkout", "-qb", "feature-clean")
    for i in range(1, 10):
        (origin / "a").write_text(f"{i}\n")
        git(origin, "commit", "-qam", f"c{i}")
    git(origin, "checkout", "-q", "main")
    data = load()
    range_ = data["env"]["RANGE"]
    key = {"RETCON_SANDBOX_NOTES_KEY": "the-secret-every-job-of-the-matrix-shares-0123456789"}
    installed = str(Path(sys.executable).parent)  # the recipe's `pip install`, done
    env = {**os.environ, **key, "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}",
           "RANGE": range_}
    (push,) = [s for s in steps_of("verify") if "git push" in s]
    for k in matrix():
        work = tmp_path / f"job{k}"
        subprocess.run(["git", "clone", "-q", str(origin), str(work)], check=True)
        result = cli("verify", range_, "--repo", str(work), "--sandbox", "local", "--build",
                     "true", "--test", "true", "--shard", f"{k}/{len(matrix())}", env=key)
        assert result.code == 0, result.out + result.err
        bash(expand(push, k), work, env)
    refs = git(origin, "for-each-ref", "--format=%(refname)", "refs/notes")
    assert refs.splitlines() == [f"{REF}-run-{RUN_ID}-{k}" for k in matrix()]

    merger = tmp_path / "merge"
    subprocess.run(["git", "clone", "-q", str(origin), str(merger)], check=True)
    for script in steps_of("merge-notes"):
        if "pip install" not in script:
            bash(expand(script), merger, env)
    assert git(origin, "for-each-ref", "--format=%(refname)", "refs/notes") == REF
    page = (merger / "report.html").read_text(encoding="utf-8")
    assert page.count("badge pass") == 2 * 9 and "not recorded" not in page  # every shard's

    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(origin), str(fresh)], check=True)
    git(fresh, "fetch", "-q", "origin", f"{REF}:{REF}")
    after = cli("verify", range_, "--repo", str(fresh), "--sandbox", "local", "--build", "true",
                "--test", "true", "--json", env=key)
    assert after.code == 0, after.out + after.err
    verified = [e for e in map(json.loads, after.out.splitlines())
                if e["event"] == "commit_verified"]
    assert len(verified) == 9 and all(e["cached"] for e in verified)


def test_docs_scaling_shows_the_workflow_verbatim() -> None:
    doc = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    assert blocks == [WORKFLOW.read_text(encoding="utf-8")]
    assert "no cluster" in doc.lower() and "What is untested" in doc
