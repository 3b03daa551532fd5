"""The engine in use, on a real engine: reached through a docker context (DOCKER_HOST unset),
named in the run's header and in --json; a context whose engine is gone is named in the error."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import Demo, cli

SOCKET = "/var/run/docker.sock"


def context(config: Path, name: str, host: str) -> dict[str, str]:
    """A docker CLI configuration whose current context is NAME at HOST; the environment that
    selects it (DOCKER_HOST unset)."""
    meta = config / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps(
        {"Name": name, "Metadata": {}, "Endpoints": {"docker": {"Host": host,
                                                                "SkipTLSVerify": False}}}))
    (config / "config.json").write_text(json.dumps({"currentContext": name}))
    return {"DOCKER_CONFIG": str(config), "DOCKER_HOST": ""}


def test_a_context_is_used_and_named(engine: DockerEngine, demo: Demo, tmp_path: Path) -> None:
    host = os.environ.get("DOCKER_HOST") or f"unix://{SOCKET}"
    env = context(tmp_path / "docker", "here", host)
    verify = cli("verify", "main..feature~9", "--build", "true", cwd=demo.path, env=env)
    assert verify.code == 0, verify.out + verify.err
    assert f"  Engine: {host} (context here)\n" in verify.out
    as_json = cli("verify", "main..feature~9", "--build", "true", "--json", cwd=demo.path,
                  env=env)
    start = json.loads(as_json.out.splitlines()[0])
    assert start["event"] == "verify_start" and start["engine"] == f"{host} (context here)"
    run = cli("execute", str(demo.spec), "--json", "--non-interactive", env=env)
    spec = next(json.loads(line) for line in run.out.splitlines()
                if json.loads(line)["event"] == "spec")
    assert spec["engine"] == f"{host} (context here)"


def test_a_context_whose_engine_is_gone_is_named(tmp_path: Path) -> None:
    env = context(tmp_path / "docker", "gone", f"unix://{tmp_path}/nothing.sock")
    result = cli("images", "list", env=env)
    assert result.code == 1
    assert f"no Docker engine answers at unix://{tmp_path}/nothing.sock (context gone)" \
        in result.err
