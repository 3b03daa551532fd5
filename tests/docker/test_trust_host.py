"""The trust boundary, host side, with real containers: hostile names, files planted beside the
spec, a spec that tries to loosen the sandbox, escape sequences in output, a hostile `.git`, and
a model that plants a file and removes it later. Each attacks from inside and is judged outside."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import cli, git, llm_env, make_demo
from tests.fake_openai import FakeOpenAI
from tests.reconstruct.test_trust_history import (
    base_of,
    forged_chain,
    stopped_despite_a_prewritten_response,
    with_histories,
)
from tests.reconstruct.test_trust_history import commit as forged_commit
from tests.repo.test_names import FILE, ODD, listing, make_repo, run_git
from tests.repo.test_provenance import PWN, injected

DOCKER = ("--non-interactive",)
ESC = "\x1b"


def test_names_cannot_inject_index_entries_and_reconstruct_exactly(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")}, {b"README": (FILE, b"r\n"), **ODD},
                     first='["dir*", "new*"]')
    result = cli("execute", str(repo / "spec.toml"), *DOCKER)
    assert result.code == 0, result.out + result.err
    assert listing(repo, "feature-clean") == listing(repo, "feature")
    first = run_git(repo, "ls-tree", "-r", "-z", "--name-only", "feature-clean~1").split(b"\0")
    assert sorted(n for n in first if n) == sorted([b"README", b"new\nline.txt",
                                                   next(n for n in ODD if n.startswith(b"dir"))])
    assert b"injected" not in b"".join(first).replace(next(n for n in ODD
                                                           if n.startswith(b"dir")), b"")


def test_files_planted_beside_the_spec_are_never_followed_or_removed(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in (".history-spec.toml.lock", "history-spec.transcript.jsonl",
                 "history-spec.toml.lock"):
        os.symlink(victim, demo.path / name)
    demo.git("add", ".history-spec.toml.lock", "history-spec.transcript.jsonl",
             "history-spec.toml.lock")
    demo.git("commit", "-qm", "plant symlinks on the checked-out branch")
    with FakeOpenAI([]) as model:
        result = cli("execute", str(demo.spec), *DOCKER, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert victim.read_text() == "precious\n"
    for name in (".history-spec.toml.lock", "history-spec.transcript.jsonl",
                 "history-spec.toml.lock"):
        assert (demo.path / name).is_symlink()
    assert demo.git("status", "--porcelain", "--untracked-files=no") == ""
    transcript = re.search(r"Transcript: (\S+)", result.out)
    assert transcript and ".git/retcon-sandbox/" in transcript.group(1)


@pytest.mark.parametrize(("old", "new", "message"), [
    ('memory = "2g"', 'memory = "0"', "memory: expected a size with a unit"),
    ('memory = "2g"', 'pids = 0', "pids: must be from 32"),
    ('memory = "2g"', 'cpus = 0', "cpus: must be from 0.1"),
    ('memory = "2g"', 'tmp_size = "0"', "tmp_size: expected a size with a unit"),
    ('memory = "2g"', 'tmp_size = "64m,suid,dev"', "tmp_size: expected a size with a unit"),
    ('memory = "2g"', 'env = ["DATABASE_URL"]', "host variables are chosen on the command line"),
])
def test_the_spec_cannot_loosen_the_sandbox(tmp_path: Path, old: str, new: str,
                                            message: str) -> None:
    text = demo_project.spec_text(True)
    text = text.replace("[sandbox]\n", f"[sandbox]\n{new}\n") if old not in text else \
        text.replace(old, new)
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    result = cli("execute", str(demo.spec), *DOCKER)
    assert result.code == 1, result.out + result.err
    assert message in result.err
    assert git(demo.path, "branch", "--list", "feature-clean") == ""


def test_only_the_command_line_passes_variables_and_never_credentials(tmp_path: Path) -> None:
    text = demo_project.spec_text(True).replace(
        'test = "', 'test = "test \\"$RS_LOCALE\\" = C.UTF-8 && test -z \\"$DATABASE_URL\\" && ',
        1)
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    env = {"RS_LOCALE": "C.UTF-8", "DATABASE_URL": "postgres://app:hunter2@db/app"}
    refused = cli("execute", str(demo.spec), *DOCKER, "--pass-env", "DATABASE_URL", env=env)
    assert refused.code == 2 and "looks like a credential" in refused.err
    result = cli("execute", str(demo.spec), *DOCKER, "--pass-env", "RS_LOCALE", env=env)
    assert result.code == 0, result.out + result.err


def test_an_image_named_by_the_spec_is_never_pulled(tmp_path: Path) -> None:
    text = demo_project.spec_text(True).replace("[sandbox]\n",
                                                '[sandbox]\nimage = "example.invalid/x:1"\n')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    result = cli("execute", str(demo.spec), *DOCKER)
    assert result.code == 1, result.out + result.err
    assert "image example.invalid/x:1 is not available (and pulling is not allowed)" in result.err
    assert "--allow-pull" in result.err


def test_escape_sequences_in_output_never_reach_the_terminal(tmp_path: Path) -> None:
    forged = ("printf '\\033]52;c;cHduZWQ=\\007\\033]0;owned\\007\\033[2J\\rTree check: "
              "cleaned == source ✓\\nComplete!\\n'; exit 1")
    text = demo_project.spec_text(True).replace(
        'test = "python3 -m pytest -q -p no:cacheprovider"', "test = '''" + forged + "'''")
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    result = cli("execute", str(demo.spec), *DOCKER)
    assert result.code == 3, result.out + result.err
    assert ESC not in result.out + result.err and "\a" not in result.out + result.err
    assert "\\e]52;c;cHduZWQ=" in result.out
    assert not any(line.startswith(("Complete!", "Tree check")) for line in
                   result.out.splitlines())
    status = cli("status", str(demo.spec))
    assert ESC not in status.out + status.err and "\\e]" in status.out
    as_json = cli("execute", str(demo.spec), *DOCKER, "--json")
    for line in as_json.out.splitlines():
        json.loads(line)  # exact JSON; escapes inside strings are JSON's own


def test_a_hostile_git_dir_runs_nothing_on_the_host(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    marker = tmp_path / "ran"
    hooks = demo.path / ".git" / "hooks"
    for hook in ("post-index-change", "reference-transaction", "pre-commit", "post-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    subprocess.run(["git", "-C", str(demo.path), "config", "core.fsmonitor",
                    f"echo fsmonitor >> {marker}; false"], check=True)
    result = cli("execute", str(demo.spec), *DOCKER)
    assert result.code == 0, result.out + result.err
    assert not marker.exists(), marker.read_text()


def test_a_planted_and_removed_file_is_reported(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()) as model:
        result = cli("execute", str(demo.spec), *DOCKER, "--json", env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    summary = next(e for e in map(json.loads, result.out.splitlines())
                   if e["event"] == "summary")
    assert [o["foreign"] for o in summary["provenance"] if o["number"] == 1] == [[PWN]]
    first = next(o for o in summary["provenance"] if o["number"] == 1)
    assert {"path": PWN, "lines": 1, "first": "on: push", "why": "new file"} in first["invented"]
    with FakeOpenAI(injected()[:5]) as model:
        demo.git("branch", "-D", "feature-clean")
        demo.spec.write_text(demo_project.spec_text(False))
        strict = cli("execute", str(demo.spec), *DOCKER, "--strict-provenance",
                     env=llm_env(model.base_url))
    assert strict.code == 3 and PWN in strict.out + strict.err


def test_a_forged_history_is_never_published(tmp_path: Path) -> None:
    """A spec recording commits rooted elsewhere stops before anything; recording commits that
    are on an (adopted) branch proves nothing: their trees are built and tested in containers
    before --squash-wip keeps them, and a failing one stops the run."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    text = demo.spec.read_text()
    root = forged_commit(demo, demo.git("rev-parse", "main^{tree}"), None, "unrelated root")
    elsewhere = forged_chain(demo, root)
    demo.spec.write_text(with_histories(text, elsewhere))
    result = cli("execute", str(demo.spec), *DOCKER, "--squash-wip")
    assert result.code == 1, result.out + result.err
    assert f"commit_created {elsewhere[0][:12]} is not on feature-clean" in result.err
    assert git(demo.path, "branch", "--list", "feature-clean") == ""

    shas = forged_chain(demo, base_of(demo))
    demo.git("branch", "feature-clean", shas[-1])
    demo.spec.write_text(with_histories(text, shas))
    adopted = cli("execute", str(demo.spec), *DOCKER, "--squash-wip", "--adopt-branch")
    assert adopted.code == 3, adopted.out + adopted.err
    assert "FAIL (exit 1)" in adopted.out and "not every one of them passes" in adopted.err
    assert "Tree check" not in adopted.out
    assert demo.git("rev-parse", "feature-clean") == shas[-1]


def test_an_existing_branch_is_refused_unless_adopted(tmp_path: Path) -> None:
    text = demo_project.spec_text(True).replace('cleaned = "feature-clean"', 'cleaned = "release"')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    demo.git("branch", "release", base_of(demo))
    result = cli("execute", str(demo.spec), *DOCKER)
    assert result.code == 1, result.out + result.err
    assert "the cleaned branch 'release' already exists" in result.err
    assert demo.git("rev-parse", "release") == base_of(demo) and demo.spec.read_text() == text
    adopted = cli("execute", str(demo.spec), *DOCKER, "--adopt-branch")
    assert adopted.code == 0, adopted.out + adopted.err
    assert demo.git("rev-parse", "release^{tree}") == demo.git("rev-parse", "feature^{tree}")


def test_a_prewritten_response_does_not_release_a_provenance_stop(tmp_path: Path) -> None:
    stopped_despite_a_prewritten_response(tmp_path, *DOCKER)
