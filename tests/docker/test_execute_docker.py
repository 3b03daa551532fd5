"""`retcon-sandbox execute` with every build, test and file tool in real containers."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker.engine import LABEL_RUN, LABEL_SPEC, DockerEngine
from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import CLI, NEUTRAL, cli, llm_env, make_demo
from tests.docker.conftest import commit_sandbox, leftover, ours, wait_for_process
from tests.fake_openai import FakeOpenAI
from tests.scripts import reconstruction

DOCKER = ("--non-interactive",)


def test_llm_reconstruction_runs_every_tool_in_containers(engine: DockerEngine,
                                                          tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction()) as model:
        result = cli("execute", str(demo.spec), *DOCKER, env=llm_env(model.base_url))
        results = model.tool_results()
    assert result.code == 0, result.out + result.err
    assert result.out.count("Sandbox ready") == 4
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")
    # the build and tests ran in the container: the container's python, not the host's
    assert any(r.startswith("Tests PASS") and "/usr/bin/python3" not in r for r in results)


def test_what_a_build_leaves_behind_never_reaches_the_host(engine: DockerEngine,
                                                           tmp_path: Path) -> None:
    hostile = (
        "mkdir -p .git/hooks build && printf '#!/bin/sh\\ntouch /tmp/retcon-pwned-hook\\n' > "
        ".git/hooks/post-commit && chmod +x .git/hooks/post-commit && "
        "printf '[core]\\n\\tfsmonitor = touch /tmp/retcon-pwned-fsmonitor\\n' > .git/config && "
        "echo artifact > build/out.bin && echo 'import os' > shop/injected.py && "
        "echo '# tampered' >> shop/cart.py && python3 -m compileall -q shop tests")
    text = demo_project.spec_text(True).replace(
        'build = "python3 -m compileall -q shop tests"', f'build = "{hostile}"')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    hooks_before = sorted(os.listdir(demo.path / ".git" / "hooks"))
    config_before = (demo.path / ".git" / "config").read_text()
    result = cli("execute", str(demo.spec), *DOCKER)
    assert result.code == 0, result.out + result.err
    for sha in demo.git("rev-list", "main..feature-clean").splitlines():
        files = demo.git("ls-tree", "-r", "--name-only", sha).splitlines()
        assert not any(f.startswith((".git", "build/")) or f == "shop/injected.py"
                       for f in files), files
    assert "# tampered" not in demo.git("show", "feature-clean:shop/cart.py")
    assert sorted(os.listdir(demo.path / ".git" / "hooks")) == hooks_before
    assert (demo.path / ".git" / "config").read_text() == config_before
    demo.git("status")  # would run an fsmonitor hook, had one reached the host
    assert not Path("/tmp/retcon-pwned-hook").exists()
    assert not Path("/tmp/retcon-pwned-fsmonitor").exists()
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_mid_run_removes_the_container(engine: DockerEngine, tmp_path: Path,
                                               signum: int) -> None:
    """SIGHUP (a closed terminal) is handled as SIGTERM and Ctrl-C are."""
    text = demo_project.spec_text(True).replace(
        'test = "python3 -m pytest -q -p no:cacheprovider"', 'test = "sleep 120"')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    proc = subprocess.Popen([*CLI, "execute", str(demo.spec), *DOCKER, "--no-base-check"],
                            cwd=NEUTRAL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the commit's own sandbox, inside its test command (not the short-lived preflight one)
    wait_for_process(engine, commit_sandbox(engine, tmp_path, proc), "sleep 120", proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not ours(engine, tmp_path)


def test_leftovers_of_a_killed_run_are_reaped(engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    with leftover(engine, {LABEL_RUN: "old", LABEL_SPEC: str(demo.spec.resolve())}) as old, \
            leftover(engine, {LABEL_RUN: "other",
                              LABEL_SPEC: str(tmp_path / "elsewhere" / "spec.toml")}) as other:
        result = cli("execute", str(demo.spec), *DOCKER)
        assert result.code == 0, result.out + result.err
        assert "Removed 1 leftover sandbox container" in result.out
        assert ours(engine, tmp_path) == [other]  # another spec's: not this run's to reap
        cleaned = cli("clean", str(tmp_path / "elsewhere" / "spec.toml"))  # no owner: not alive
        assert cleaned.code == 0 and "Removed 1 sandbox container" in cleaned.out
        assert old not in engine.sandbox_containers()


def test_demo_command(engine: DockerEngine, tmp_path: Path) -> None:
    result = cli("demo", "--directory", str(tmp_path / "demo"))
    assert result.code == 0, result.out + result.err
    assert "Tree check: feature-clean == feature ✓" in result.out
    assert result.out.count("✓ Commit created") == 4
    log = subprocess.run(["git", "-C", str(tmp_path / "demo"), "log", "--format=%s",
                          "main..feature-clean"], capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 4
