"""The pull-request recipe (docs/ci/github-actions-pr.yml): safe for pull requests from forks.
It runs on `pull_request` (never `pull_request_target`, which runs with the base repository's
secrets and a write token), with a read-only token, no secret, no model, nothing pushed and no
credentials left in the checkout; it only verifies the pull request's commits, and what it
finds stays in the job (summary, annotations, report). Without the team's notes key every
result it fetches is a claim, and `--trust-notes` never appears."""

from __future__ import annotations

import re
import shlex
from typing import Any

from retcon_sandbox.cli import parser
from tests.conftest import ROOT
from tests.test_ci_recipe import EVENTS, JOB, STEP, TOP, USES, check_pinned_install, image_steps
from tests.test_ci_recipe import load as load_workflow

WORKFLOW = ROOT / "docs" / "ci" / "github-actions-pr.yml"


def load() -> dict[str, Any]:
    return load_workflow(WORKFLOW)


def job() -> dict[str, Any]:
    (only,) = load()["jobs"].values()
    assert isinstance(only, dict)
    return only


def test_the_workflow_has_the_shape_github_accepts() -> None:
    data = load()
    assert set(data) <= TOP and {"on", "jobs"} <= set(data)
    for step in job()["steps"]:
        assert set(step) <= STEP and ("uses" in step) != ("run" in step), step
        assert "uses" not in step or re.fullmatch(USES, step["uses"]), step
    assert set(job()) <= JOB
    assert data["on"] in EVENTS


def test_it_runs_untrusted_pull_requests_with_nothing_to_lose() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    data = load()
    assert data["on"] == "pull_request"
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "pull_request_target" not in body and "workflow_run" not in body
    assert data["permissions"] == {"contents": "read"} and "permissions" not in job()
    assert "secrets." not in text and "OPENAI" not in text and "RETCON_SANDBOX_MODEL" not in text
    assert "RETCON_SANDBOX_NOTES_KEY" not in body  # every result it reads is a claim
    assert "git push" not in text and "--trust-notes" not in text
    (checkout,) = [s for s in job()["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["persist-credentials"] is False
    # the pull request's values reach the shell through the environment, never spliced in
    assert all("${{" not in s.get("run", "") for s in job()["steps"])
    cache = image_steps(job())["cache"]
    assert cache["uses"].startswith("actions/cache/restore@")  # it never writes the cache
    check_pinned_install(data)


def test_it_verifies_and_reports_the_pull_requests_commits() -> None:
    env = {**load()["env"], "BASE_SHA": "a" * 40, "HEAD_SHA": "b" * 40,
           "GITHUB_STEP_SUMMARY": "/home/runner/summary.md"}
    commands = {}
    for step in job()["steps"]:
        run = step.get("run", "")
        if run.startswith("retcon-sandbox verify") or run.startswith("retcon-sandbox report"):
            words = [re.sub(r"\$(\w+)", lambda m: env[m.group(1)], w) for w in shlex.split(run)]
            args = parser().parse_args(words[1:])
            commands[args.command] = (args, step)
    verify, _ = commands["verify"]
    assert verify.target == f"{'a' * 40}..{'b' * 40}" and not verify.trust_notes
    assert verify.build == env["BUILD"] and verify.test == env["TEST"]
    assert verify.format == "github" and verify.junit == "junit.xml"
    assert verify.summary == env["GITHUB_STEP_SUMMARY"]
    report, step = commands["report"]
    assert report.range == verify.target and report.output == "report.html"
    assert step["if"] == "always()"
    (upload,) = [s for s in job()["steps"] if s.get("uses", "").startswith(
        "actions/upload-artifact@")]
    assert upload["if"] == "always()"
    assert upload["with"]["path"].split() == ["junit.xml", "report.html"]
