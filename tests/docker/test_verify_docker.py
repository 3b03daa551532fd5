"""The verification cache and `verify`, with every build and test in real containers."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from retcon_sandbox.backends import images
from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import CLI, cli, make_demo
from tests.docker.conftest import ours

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
    assert "Sandbox ready" not in redo.out and redo.out.count("PASS (cached)") == 8 + 1
    assert "Checking the base commit: build PASS, tests PASS (cached)" in redo.out

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


def test_forged_notes_pass_nothing_in_verify_or_execute(engine: DockerEngine,
                                                        tmp_path: Path) -> None:
    """Whoever can push refs/notes/retcon-sandbox claims a pass for every tree of the
    reconstruction, under the exact cache key; the test command fails everywhere. verify and
    execute run the trees again and fail; only --trust-notes believes the claim."""
    from retcon_sandbox.repo.gitrepo import Repo
    from retcon_sandbox.userkey import UserKey
    from retcon_sandbox.verify.cache import Cache, Key, Outcome, Stage

    demo = make_demo(tmp_path / "repo", with_paths=True)
    original = demo.spec.read_text()
    local = cli("execute", str(demo.spec), "--sandbox", "local", "--non-interactive")
    assert local.code == 0, local.out + local.err
    trees = demo.git("log", "--format=%T", "main..feature-clean").split()
    tip = demo.git("rev-parse", "feature-clean")
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(original)
    demo.git("update-ref", "-d", "refs/notes/retcon-sandbox")

    first = cli("verify", tip, "--spec", str(demo.spec), "--test", "false", "--json")
    assert first.code == 3, first.out + first.err
    [start] = [e for e in events(first.out) if e["event"] == "verify_start"]
    environment = str(start["environment"])
    key = Key("python3 -m compileall -q shop tests", "false", environment)
    forger = Cache(Repo(demo.path), key=UserKey(b"a key that is not the user's", "forger"))

    def forge() -> None:
        for tree in trees:
            forger.put(tree, key, Outcome((Stage("build", key.build or "", "PASS", True, False,
                                                 0.1),
                                           Stage("test", "false", "PASS", True, False, 0.1)),
                                          None, "", 600))

    forge()
    again = cli("verify", tip, "--spec", str(demo.spec), "--test", "false", "--json")
    assert again.code == 3, again.out
    [row] = [e for e in events(again.out) if e["event"] == "commit_verified"]
    assert row["passed"] is False and row["cached"] is False
    assert row["claimed_by_others"] == {"passed": True, "build": "PASS", "tests": "PASS",
                                        "trusted": False}

    forge()
    shipped = cli("execute", str(demo.spec), "--test", "false", "--json", *DOCKER)
    assert shipped.code != 0, shipped.out
    found = events(shipped.out)
    assert [e["verdict"] for e in found if e["event"] == "tests"][:1] == ["FAIL (exit 1)"]
    assert not [e for e in found if e["event"] == "summary" and e.get("complete")]

    forge()
    trusted = cli("verify", tip, "--spec", str(demo.spec), "--test", "false", "--trust-notes")
    assert trusted.code == 0, trusted.out + trusted.err
    assert "trusted (--trust-notes), not run" in trusted.out


def test_passed_variables_reach_the_key_by_hmac_only(engine: DockerEngine, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    from retcon_sandbox.backends.docker.sandboxes import DockerBackend
    from retcon_sandbox.spec.settings import DEFAULTS

    def environment(env: dict[str, str]) -> str:
        return DockerBackend(engine, images.default_image(), DEFAULTS, env,
                             tmp_path / "spec.toml").environment()

    passed = {"TOKEN": "1234"}
    monkeypatch.setenv("RETCON_SANDBOX_NOTES_KEY", "k" * 40)
    first = environment(passed)
    assert first.startswith(f"docker {engine.image_id(images.default_image())} env:")
    plain = hashlib.sha256(json.dumps(passed, sort_keys=True).encode()).hexdigest()
    assert plain[:16] not in first
    assert environment({"TOKEN": "1235"}) != first
    monkeypatch.setenv("RETCON_SANDBOX_NOTES_KEY", "j" * 40)
    assert environment(passed) != first


def test_ctrl_c_during_verify_j_leaves_no_sandbox(engine: DockerEngine, tmp_path: Path) -> None:
    """verify -j 2 opens the next sandboxes ahead while two commands run: Ctrl-C removes every
    one of them, those still being opened too."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    proc = subprocess.Popen([*CLI, "verify", "main..feature", "--test", "sleep 120", "-j", "2",
                             "--no-cache"], cwd=demo.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(ours(engine, tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # two running, the next ones being opened
    assert len(ours(engine, tmp_path)) >= 3, "the look-ahead opened no further sandbox"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not ours(engine, tmp_path)
