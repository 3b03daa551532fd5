"""`retcon-sandbox clean` on a real engine: a run in progress keeps its container, a dead run's is
removed, `--all` removes both. Every `clean` here names the specs of this test, so sessions that
share the engine never lose theirs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from retcon_sandbox.backends.docker import liveness, sandboximages
from retcon_sandbox.backends.docker.engine import LABEL_RUN, LABEL_SPEC, DockerEngine
from retcon_sandbox.errors import ImageError
from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import CLI, NEUTRAL, Demo, cli, make_demo
from tests.docker.conftest import commit_sandbox, ours

SLOW = demo_project.spec_text(True).replace('test = "python3 -m pytest -q -p no:cacheprovider"',
                                            'test = "sleep 300"')


def start(demo: Demo) -> subprocess.Popen[str]:
    # --no-base-check: the preflight sandbox would run the base commit's `sleep 300` itself;
    # --no-pipeline: one sandbox at a time (the next commit's is not pre-warmed during a test)
    return subprocess.Popen([*CLI, "execute", str(demo.spec), "--non-interactive",
                             "--no-base-check", "--no-pipeline"], cwd=NEUTRAL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def dead_pid() -> str:
    """A process that has exited: its pid is what a killed run leaves on its containers."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return str(proc.pid)


def left_by_a_dead_run(engine: DockerEngine, like: str, spec: Path) -> str:
    """What a run that died leaves when its container did not end itself (created and never
    started, or made by a version without the keeper): the labels of a live run's container,
    naming `spec` and a process that has exited. Its id."""
    box = engine.client.containers.get(like)
    labels = {**box.labels, "retcon-sandbox.spec": str(spec), "retcon-sandbox.pid": dead_pid()}
    return str(engine.client.containers.create(str(box.attrs["Image"]), ["sleep", "infinity"],
                                               labels=labels).id)


def test_clean_keeps_a_live_run_and_removes_a_dead_one(engine: DockerEngine,
                                                       tmp_path: Path) -> None:
    live = make_demo(tmp_path / "live", with_paths=True, spec_text=SLOW)
    dead = make_demo(tmp_path / "dead", with_paths=True, spec_text=SLOW)
    running = start(live)
    try:
        live_box = [commit_sandbox(engine, tmp_path / "live", running)]
        dead_box = [left_by_a_dead_run(engine, live_box[0], dead.spec)]
        assert ours(engine, tmp_path / "dead") == dead_box

        result = cli("clean", str(live.spec), str(dead.spec))
        assert result.code == 0, result.out + result.err
        assert "Removed 1 sandbox container(s)." in result.out
        assert "Kept 1 of runs still in progress" in result.out and "--all" in result.out
        assert ours(engine, tmp_path / "dead") == []
        assert ours(engine, tmp_path / "live") == live_box
        assert running.poll() is None  # the live run goes on

        result = cli("clean", "--all", str(live.spec), str(dead.spec))
        assert result.code == 0 and "Removed 1 sandbox container(s)." in result.out
        assert ours(engine, tmp_path) == []
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGTERM)
        running.communicate(timeout=120)


def test_clean_all_removes_live_and_dead_runs(engine: DockerEngine, tmp_path: Path) -> None:
    live = make_demo(tmp_path / "live", with_paths=True, spec_text=SLOW)
    dead = make_demo(tmp_path / "dead", with_paths=True, spec_text=SLOW)
    running = start(live)
    try:
        left_by_a_dead_run(engine, commit_sandbox(engine, tmp_path / "live", running),
                           dead.spec)
        assert len(ours(engine, tmp_path)) == 2
        result = cli("clean", "--all", str(live.spec), str(dead.spec))
        assert result.code == 0 and "Removed 2 sandbox container(s)." in result.out
        assert ours(engine, tmp_path) == []
        _, err = running.communicate(timeout=120)  # its sandbox is gone: the run fails
        assert running.returncode == 1 and "✗ error: the sandbox" in err, err
        assert "Traceback" not in err
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGTERM)
            running.communicate(timeout=120)


def unnamed_environment(engine: DockerEngine, spec: Path, pid: str) -> str:
    """What a setup killed between saving its image and naming it leaves: an untagged image
    with a prepared environment's label and its run's labels (the setup container's)."""
    owner = liveness.labels_of(liveness.this_process())
    container = engine.client.containers.create(
        sandboximages.default_image(), ["true"],
        labels={**owner, LABEL_RUN: "test", LABEL_SPEC: str(spec), liveness.LABEL_PID: pid})
    try:
        return engine.commit_container(str(container.id), {sandboximages.LABEL_ENV_SCOPE: "test"})
    finally:
        container.remove(force=True)


def test_clean_removes_the_unnamed_image_of_a_killed_setup(engine: DockerEngine,
                                                           tmp_path: Path) -> None:
    live_spec, dead_spec = tmp_path / "live.toml", tmp_path / "dead.toml"
    live = unnamed_environment(engine, live_spec, str(os.getpid()))
    dead = unnamed_environment(engine, dead_spec, dead_pid())
    unrelated = unnamed_environment(engine, tmp_path / "other.toml", dead_pid())
    try:
        result = cli("clean", str(live_spec), str(dead_spec))
        assert result.code == 0, result.out + result.err
        assert "Removed 1 unnamed environment image(s)" in result.out
        left = engine.untagged_images(sandboximages.LABEL_ENV_SCOPE)
        assert live in left and dead not in left and unrelated in left

        result = cli("clean", "--all", str(live_spec), "--json")
        assert json.loads(result.out)["images"] == 1, result.out + result.err
        assert live not in engine.untagged_images(sandboximages.LABEL_ENV_SCOPE)
    finally:
        for image in (live, dead, unrelated):
            with contextlib.suppress(ImageError):
                engine.remove_image(image)
