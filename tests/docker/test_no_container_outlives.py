"""No container outlives its run: a run killed with -9 (nothing of ours cleans up) at each phase
(setup with its egress proxy, a sandbox opening, a build or test, a model's turn, `verify`'s
workers) leaves no container once a bounded wait is over. Each container's first process (the
keeper) ends it when the run's connection closes; the engine removes it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import LABEL_RUN, LABEL_SPEC, DockerEngine
from retcon_sandbox.repo import demoproject as demo_project
from tests.conftest import CLI, NEUTRAL, Demo, cli, llm_env, make_demo
from tests.docker.conftest import ours, wait_for_process
from tests.fake_openai import FakeOpenAI, Hang, call

GONE_S = 30.0  # the bound: the keeper sees its input end at once; the engine then removes it
TEST = 'test = "python3 -m pytest -q -p no:cacheprovider"'


def spec_with(sandbox: str, with_paths: bool = True) -> str:
    return demo_project.spec_text(with_paths).replace(TEST, sandbox)


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args, "--non-interactive", "--no-base-check"], cwd=NEUTRAL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def step_container(engine: DockerEngine, base: Path, proc: subprocess.Popen[str],
                   steps: tuple[str, ...]) -> str:
    """A container of this test whose step is one of `steps`, once one runs."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        mine = set(ours(engine, base))
        for container in engine.client.containers.list(filters={"label": LABEL_RUN},
                                                       ignore_removed=True):
            if str(container.id) in mine and container.labels.get("retcon-sandbox.step") in steps:
                return str(container.id)
        time.sleep(0.1)
    raise AssertionError(f"no {steps} container ran")


def processes(engine: DockerEngine, container_id: str) -> str:
    """The container's process list as text ("" once it is gone)."""
    try:
        rows = engine.client.containers.get(container_id).top().get("Processes") or []
    except Exception:  # removed meanwhile: it runs nothing
        return ""
    return "\n".join(" ".join(row) for row in rows)


def killed_leaves_nothing(engine: DockerEngine, base: Path, proc: subprocess.Popen[str],
                          before: Callable[[], object] = lambda: None) -> None:
    """kill -9 the run's own process (its children live on: nothing of ours), then every
    container of this test must be gone within GONE_S."""
    try:
        before()
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        deadline = time.monotonic() + GONE_S
        while ours(engine, base) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ours(engine, base) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)


def test_killed_in_setup_with_its_egress_proxy(engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True,
                     spec_text=spec_with('test = "true"\nsetup = "sleep 300"'))
    proc = start("execute", str(demo.spec))

    def in_setup() -> None:
        setup = step_container(engine, tmp_path, proc, ("setup",))
        wait_for_process(engine, setup, "sleep 300", proc)
        assert len(ours(engine, tmp_path)) == 2  # the setup's container and its proxy

    killed_leaves_nothing(engine, tmp_path, proc, in_setup)
    # the setup's networks are not containers: the next run (or `clean`) removes them
    cleaned = cli("clean", str(demo.spec))
    assert cleaned.code == 0, cleaned.out + cleaned.err
    assert not [n for n, labels in engine.sandbox_networks().items()
                if labels.get("retcon-sandbox.spec", "").startswith(str(tmp_path))]


def test_killed_as_a_sandbox_opens(engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=spec_with('test = "true"'))
    proc = start("execute", str(demo.spec))
    killed_leaves_nothing(engine, tmp_path, proc,
                          lambda: step_container(engine, tmp_path, proc, ("preflight",)))


def test_killed_in_a_test_command(engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True,
                     spec_text=spec_with('test = "sleep 300"'))
    proc = start("execute", str(demo.spec), "--no-pipeline")
    killed_leaves_nothing(engine, tmp_path, proc, lambda: wait_for_process(
        engine, step_container(engine, tmp_path, proc, ("commit-1",)), "sleep 300", proc))


def test_killed_in_a_models_turn(engine: DockerEngine, tmp_path: Path) -> None:
    demo: Demo = make_demo(tmp_path / "repo", with_paths=False,
                           spec_text=spec_with('test = "true"', with_paths=False))
    with FakeOpenAI([[call("read_file", path="shop/cart.py")], Hang()]) as model:
        proc = start("execute", str(demo.spec), env=llm_env(model.base_url))

        def in_a_turn() -> None:  # the preflight's sandbox is handed to commit 1
            step_container(engine, tmp_path, proc, ("commit-1", "preflight"))
            deadline = time.monotonic() + 180
            while len(model.requests) < 2 and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.1)
            assert len(model.requests) == 2  # the model's second turn: it does not answer

        killed_leaves_nothing(engine, tmp_path, proc, in_a_turn)


def test_killed_while_verify_runs_its_workers(engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=spec_with('test = "true"'))
    proc = subprocess.Popen([*CLI, "verify", "main..feature", "--test", "sleep 300", "-j", "2",
                             "--no-cache"], cwd=demo.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)

    def both_testing() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            running = [c for c in ours(engine, tmp_path) if "sleep 300" in processes(engine, c)]
            if len(running) == 2:
                return
            time.sleep(0.2)
        raise AssertionError("the two workers never ran their tests")

    killed_leaves_nothing(engine, tmp_path, proc, both_testing)


def test_a_container_the_engine_is_removing_already_is_gone_once_discarded(
        engine: DockerEngine, tmp_path: Path) -> None:
    """A sandbox whose keeper has ended is being removed by the engine (auto-remove), and a
    second removal is refused while that one runs (409). Discarding it returns once it is gone,
    not before: a run that has removed its containers leaves none for `docker ps -a` to list,
    even on a busy engine (CI once found one there right after a SIGTERM)."""
    image = sandboximages.default_image()
    for _ in range(10):
        container = engine.client.containers.create(
            image, ["60"], entrypoint=["sleep"], auto_remove=True,
            labels={LABEL_RUN: "discard-test", LABEL_SPEC: str(tmp_path / "spec.toml")})
        container.start()
        container_id = str(container.id)
        engine.client.api.kill(container_id)  # its first process ends: the engine removes it
        engine.discard_container(container_id)
        assert not engine.client.containers.list(all=True, filters={"id": container_id})
