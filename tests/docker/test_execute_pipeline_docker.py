"""`execute --pipeline` in real containers: the serial run's history, commits and trees with a
fix, and a Ctrl-C while the next commit is being speculated removes its container."""

from __future__ import annotations

from pathlib import Path

from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.commands.test_execute_pipeline import (
    DOCKER,
    reset,
    run,
    speculations,
    stop_while_speculating,
)
from tests.conftest import make_demo
from tests.docker.conftest import ours
from tests.scripts import by_request


def test_pipelined_run_in_containers_is_the_serial_run_and_a_stop_leaves_nothing(
        engine: DockerEngine, tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    original = demo.spec.read_text()
    serial_spec, serial_branch, _ = run(demo, by_request(), "--no-pipeline", where=DOCKER)
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
