"""`--json` for the commands that talk to the engine: `images list|build` and `clean`."""

from __future__ import annotations

import json
from pathlib import Path

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import cli


def test_images_list_and_build_json(engine: DockerEngine) -> None:
    listed = cli("images", "list", "--json")
    assert listed.code == 0, listed.err
    rows = [json.loads(line) for line in listed.out.splitlines()]
    base = next(r for r in rows if r["name"] == "base")
    assert base["event"] == "image" and base["schema"] == 1
    assert base["tag"] == sandboximages.CATALOG["base"].tag and base["state"] == "current"
    built = cli("images", "build", "base", "--json")
    assert built.code == 0, built.err
    assert [(e["event"], e["tag"]) for e in map(json.loads, built.out.splitlines())] == [
        ("image_built", sandboximages.CATALOG["base"].tag)]


def test_clean_json_is_one_summary_event(engine: DockerEngine, tmp_path: Path) -> None:
    result = cli("clean", str(tmp_path / "no-such-spec.toml"), "--json")
    assert result.code == 0, result.err
    (event,) = [json.loads(line) for line in result.out.splitlines()]
    assert event["event"] == "clean" and event["schema"] == 1
    assert (event["removed"], event["kept"], event["networks"], event["all"]) == (0, 0, 0, False)
