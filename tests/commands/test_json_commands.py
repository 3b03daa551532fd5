"""`--json` beyond execute and verify: `demo` and `images tag` (the commands that need the
engine, `images list|build` and `clean`, are in tests/docker/test_json_commands.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker import sandboximages
from tests.conftest import cli, git


def events(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow
def test_demo_json_is_the_run_events_then_a_demo_event(tmp_path: Path) -> None:
    result = cli("demo", "--directory", str(tmp_path / "demo"), "--sandbox", "local", "--json")
    assert result.code == 0, result.out + result.err
    found = events(result.out)  # every line is JSON: no human text on stdout
    assert all(e["schema"] == 1 for e in found)
    names = [e["event"] for e in found]
    assert "summary" in names and names[-1] == "demo"
    demo = found[-1]
    assert demo["tree_equal"] is True and demo["directory"] == str(tmp_path / "demo")
    messy, clean = demo["messy"], demo["clean"]
    assert isinstance(messy, list) and isinstance(clean, list)
    assert len(messy) == 10 and len(clean) == 4
    assert clean[-1] == git(tmp_path / "demo", "rev-parse", "feature-clean")  # oldest first


def test_images_tag_prints_the_current_tag_without_an_engine() -> None:
    env = {"DOCKER_HOST": "tcp://127.0.0.1:9"}  # nothing answers there: none is needed
    plain = cli("images", "tag", "base", env=env)
    assert plain.code == 0, plain.err
    assert plain.out == sandboximages.CATALOG["base"].tag + "\n"
    as_json = cli("images", "tag", "node", "--json", env=env)
    assert events(as_json.out) == [{**events(as_json.out)[0], "event": "image", "name": "node",
                                    "tag": sandboximages.CATALOG["node"].tag, "schema": 1}]
    unknown = cli("images", "tag", "java", env=env)
    assert unknown.code == 2 and "no image named 'java'" in unknown.err
