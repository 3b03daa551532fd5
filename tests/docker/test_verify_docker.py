"""The verification cache and `verify`, with every build and test in real containers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from retcon_sandbox.backends import images
from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import cli, make_demo

DOCKER = ("--non-interactive",)


def events(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_cached_trees_need_no_container_and_verify_runs_n_at_a_time(engine: DockerEngine,
                                                                    tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    original = demo.spec.read_text()
    first = cli("execute", str(demo.spec), *DOCKER)
    assert first.code == 0 and first.out.count("Sandbox ready") == 4, first.out + first.err

    # a redo: the same trees, so no build, no test, no container
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(original)
    redo = cli("execute", str(demo.spec), *DOCKER)
    assert redo.code == 0, redo.out + redo.err
    assert "Sandbox ready" not in redo.out and redo.out.count("PASS (cached)") == 8

    # the environment is the image's ID (what the tag names today), then the setup's key
    cached = cli("verify", str(demo.spec), "--json")
    assert cached.code == 0, cached.err
    start = events(cached.out)[0]
    image_id = engine.client.images.get(images.default_image()).id
    assert start["event"] == "verify_start"
    assert re.fullmatch(f"docker {image_id} setup:[0-9a-f]{{16}}", str(start["environment"]))
    assert all(e["cached"] for e in events(cached.out) if e["event"] == "commit_verified")

    again = cli("verify", str(demo.spec), "--no-cache", "-j", "2", "--json")
    assert again.code == 0, again.err
    verified = [e for e in events(again.out) if e["event"] == "commit_verified"]
    assert len(verified) == 4 and not any(e["cached"] for e in verified)
    assert all(e["build"] == "PASS" and e["tests"] == "PASS" for e in verified)

    messy = cli("verify", "main..feature", "--spec", str(demo.spec), "-j", "2", cwd=demo.path)
    assert messy.code == 3, messy.out + messy.err
    assert "10 commits: 8 passed, 2 failed" in messy.out
    assert "SyntaxError" in messy.out and "KeyError: 'SUMMER25'" in messy.out
