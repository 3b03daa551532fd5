"""Installs as a user makes them: a wheel in a fresh virtual environment outside the checkout,
and every install line of the README, run as written from a directory that is not the checkout.

These need PyPI for the runtime dependencies (as any install does) and the Docker engine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from retcon_sandbox import __version__
from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import ROOT, building_from_root

CONSTRAINTS = ROOT / "constraints" / "dev.txt"
IGNORED = shutil.ignore_patterns(".git", "__pycache__", ".*_cache", "*.egg-info", "build", "dist")


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{command}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    with building_from_root():
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist,
            ROOT, cwd=dist)
    (found,) = dist.glob("retcon_sandbox-*.whl")
    return found


def test_the_wheel_holds_one_package_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"retcon_sandbox",
                                                 f"retcon_sandbox-{__version__}.dist-info"}
    for data in ("retcon_sandbox/dockerfiles/base/Dockerfile",
                 "retcon_sandbox/dockerfiles/node/Dockerfile", "retcon_sandbox/sandbox/helper.py",
                 "retcon_sandbox/model/prompts/system.md", "retcon_sandbox/py.typed",
                 "retcon_sandbox/protocol.py", "retcon_sandbox/backends/docker/engine.py"):
        assert data in names, data


def test_a_wheel_in_a_fresh_venv_builds_its_image_and_runs_the_demo(
        wheel: Path, engine: DockerEngine, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run(sys.executable, "-m", "venv", venv, cwd=elsewhere)
    run(venv / "bin" / "pip", "install", "-q", "-c", CONSTRAINTS, wheel, cwd=elsewhere)
    for name in ("runner", "sandbox"):  # no generic top-level packages
        missing = subprocess.run([venv / "bin" / "python", "-c", f"import {name}"],
                                 cwd=elsewhere, capture_output=True, text=True)
        assert "ModuleNotFoundError" in missing.stderr, name
    version = run(venv / "bin" / "python", "-m", "retcon_sandbox", "--version", cwd=elsewhere)
    assert version.stdout.strip() == f"retcon-sandbox {__version__}"
    prefix = f"retcon-sandbox-wheeltest-{uuid.uuid4().hex[:8]}"
    env = {"RETCON_SANDBOX_IMAGE_PREFIX": prefix, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    try:
        demo = run(venv / "bin" / "retcon-sandbox", "demo", "--directory", elsewhere / "demo",
                   cwd=elsewhere, env=env)
        assert f"Building {prefix}/base:" in demo.stderr  # from the wheel's own Dockerfile
        assert "Tree check: feature-clean == feature ✓" in demo.stdout
        listing = run(venv / "bin" / "retcon-sandbox", "images", "list", cwd=elsewhere, env=env)
        assert re.search(rf"base\s+{re.escape(prefix)}/base:\w+\s+current", listing.stdout)
    finally:
        for tag in engine.image_tags(prefix + "/"):
            engine.remove_image(tag)


def readme_install_lines() -> list[str]:
    """The commands of the README's "Install" block."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Install", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip() for line in block.splitlines()
            if line.split("#")[0].strip()]


@pytest.mark.parametrize("line", readme_install_lines())
def test_each_readme_install_line_works_as_written(line: str, tmp_path: Path) -> None:
    """From the directory that holds a clone named retcon-sandbox, as the README says."""
    shutil.copytree(ROOT, tmp_path / "retcon-sandbox", symlinks=True, ignore=IGNORED)
    home = tmp_path / "home"
    bin_dir = home / ".local" / "bin"
    venv = tmp_path / "pip-venv"
    tool = line.split()[0]
    # pip's line runs the venv's pip; for the others it is only another interpreter, and
    # ensurepip is 3 CPU-seconds
    run(sys.executable, "-m", "venv", *(() if tool == "pip" else ("--without-pip",)), venv,
        cwd=tmp_path)
    env = {"HOME": str(home), "PIPX_HOME": str(home / "pipx"), "PIPX_BIN_DIR": str(bin_dir),
           "UV_TOOL_DIR": str(home / "uv-tools"), "UV_TOOL_BIN_DIR": str(bin_dir),
           "PIP_CONSTRAINT": str(CONSTRAINTS), "UV_CONSTRAINT": str(CONSTRAINTS),
           "PATH": f"{bin_dir}:{venv / 'bin'}:{os.environ['PATH']}"}
    run("sh", "-c", line, cwd=tmp_path, env=env)
    version = run("retcon-sandbox", "--version", cwd=tmp_path, env=env)
    assert version.stdout.strip() == f"retcon-sandbox {__version__}"
    prompt = run("retcon-sandbox", "prompt", cwd=tmp_path, env=env)  # package data is there
    assert "history spec" in prompt.stdout
    module = run("sh", "-c", f"{TOOL_PYTHON[tool]} -m retcon_sandbox --version", cwd=tmp_path,
                 env=env)
    assert module.stdout.strip() == f"retcon-sandbox {__version__}"
    if tool != "pip":  # an isolated install: another interpreter (the empty venv's) lacks it
        alone = subprocess.run([venv / "bin" / "python", "-m", "retcon_sandbox", "--version"],
                               cwd=tmp_path, env={**os.environ, **env}, capture_output=True,
                               text=True)
        assert alone.returncode != 0 and "No module named retcon_sandbox" in alone.stderr


# `python -m retcon_sandbox` after each install line: pipx and uv install into an environment
# of their own, whose interpreter is the one that has the package (what the docs say to run).
TOOL_PYTHON = {"pip": "python",
               "pipx": '"$(pipx environment --value PIPX_LOCAL_VENVS)/retcon-sandbox/bin/python"',
               "uv": '"$(uv tool dir)/retcon-sandbox/bin/python"'}
