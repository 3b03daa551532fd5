"""compose.yaml as documented: its configuration (no empty variables, the socket and the base
image from the environment, the image named after the version, the state volume), and one real
run of the demo through it, as the owner of the repository rather than root, on the base image
`retcon-sandbox images build` made, then `verify` runs that find what earlier containers
recorded: through the state volume, or through RETCON_SANDBOX_NOTES_KEY."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from retcon_sandbox import __version__
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import ROOT, building_from_root, exclusive

MODEL_VARIABLES = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "RETCON_SANDBOX_MODEL",
                   "RETCON_SANDBOX_MODEL_TIMEOUT", "RETCON_SANDBOX_MODEL_ATTEMPTS",
                   "RETCON_SANDBOX_MODEL_DEADLINE", "RETCON_SANDBOX_MODEL_MAX_WAIT")
PASSED = (*MODEL_VARIABLES, "DOCKER_HOST", "RETCON_SANDBOX_NOTES_KEY",
          "RETCON_SANDBOX_ENGINE_TIMEOUT")


def compose() -> list[str]:
    """The Compose v2 plugin, else docker-compose v1; the tier fails without either."""
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True)
    if plugin.returncode == 0:
        return ["docker", "compose"]
    legacy = shutil.which("docker-compose")
    assert legacy, "neither `docker compose` nor docker-compose is installed"
    return [legacy]


def run_compose(*args: str, env: dict[str, str], timeout: float = 900,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in PASSED}
    proc = subprocess.run([*compose(), "-f", str(ROOT / "compose.yaml"), *args], cwd=ROOT,
                          capture_output=True, text=True, env={**clean, **env},
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert not check or proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture
def project() -> Iterator[dict[str, str]]:
    """A Compose project of the test's own: tests running side by side each get their network
    (two `run`s of one project at once may each create it, and then neither can use it)."""
    env = {"COMPOSE_PROJECT_NAME": f"retcon-test-{uuid.uuid4().hex[:12]}"}
    yield env
    run_compose("down", "--volumes", env=env, check=False)


def build_with_host_wheels(env: dict[str, str]) -> None:
    """As the README says for a network that intercepts TLS: the host (which trusts the CA)
    makes the wheels, and the image installs them with no index."""
    wheels = ROOT / "wheels"
    with building_from_root():
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), str(ROOT)],
                       check=True, capture_output=True, timeout=900)
    try:
        run_compose("build", "retcon-sandbox", env=env)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


@pytest.fixture(scope="session")
def runner_base(engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """retcon-sandbox/runner:latest, built once per test session on the base `images build` made
    (xdist workers take turns under a lock: the first builds, the others find it built, and no
    two write ROOT/wheels at once). Returns the base."""
    base = sandboximages.ensure(engine, sandboximages.CATALOG["base"].tag, print)
    shared = tmp_path_factory.getbasetemp().parent  # one folder for every worker of the run
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
    with exclusive(shared / "compose-runner.lock"):
        built = shared / f"compose-runner-{run}.built"
        if not built.exists():
            build_with_host_wheels({"RETCON_SANDBOX_BASE_IMAGE": base})
            built.write_text(base)
    return base


def test_compose_config_has_no_empty_variable_and_takes_socket_and_base_from_the_env(
        tmp_path: Path) -> None:
    socket = tmp_path / "engine.sock"
    env = {"DOCKER_SOCK": str(socket), "RETCON_SANDBOX_BASE_IMAGE": "example/base:abc",
           "REPO": str(tmp_path), "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    config = yaml.safe_load(run_compose("config", env=env).stdout)
    service = config["services"]["retcon-sandbox"]
    assert service["build"]["args"]["BASE"] == "example/base:abc"
    volumes = [v if isinstance(v, str) else f"{v['source']}:{v['target']}"
               for v in service["volumes"]]
    assert any(v.startswith(f"{socket}:/var/run/docker.sock") for v in volumes), volumes
    assert any(v.startswith(f"{tmp_path}:/repo") for v in volumes), volumes
    assert any(v.startswith("state:/state") or v.endswith("_state:/state") for v in volumes)
    assert set(config["volumes"]) == {"state"}
    assert service["image"] == f"retcon-sandbox/runner:{__version__}"  # not one :latest for all
    environment = service["environment"]
    # set: passed as it is; unset: not set in the container at all (never an empty string)
    assert environment["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert all(environment.get(name) in (None, "http://127.0.0.1:9/v1") for name in PASSED)
    assert "" not in environment.values()
    given = {name: f"value-of-{name}" for name in PASSED}
    passed = yaml.safe_load(run_compose("config", env=given).stdout)["services"][
        "retcon-sandbox"]["environment"]
    assert {name: passed.get(name) for name in PASSED} == given
    default = yaml.safe_load(run_compose("config", env={}).stdout)["services"]["retcon-sandbox"]
    assert default["build"]["args"]["BASE"] == "retcon-sandbox/base:compose"
    assert "user" not in default  # the entrypoint takes the repository owner's identity


def test_the_demo_runs_through_compose_as_the_repository_owner(
        runner_base: str, project: dict[str, str], tmp_path: Path) -> None:
    owner = os.getuid() if os.getuid() != 0 else 1234  # never root: that is what we test
    repo = tmp_path / "mounted"
    repo.mkdir()
    os.chown(repo, owner, owner)
    env = {"RETCON_SANDBOX_BASE_IMAGE": runner_base, "REPO": str(repo), **project}
    demo = run_compose("run", "--rm", "retcon-sandbox", "demo", "--directory", "/repo/demo",
                       env=env, timeout=600)
    assert "Tree check: feature-clean == feature ✓" in demo.stdout, demo.stdout + demo.stderr
    state = repo / "demo" / ".git" / "retcon-sandbox"
    owners = {p.stat().st_uid for p in [state, *state.iterdir()]}
    assert owners == {owner}  # nothing root-owned left for later runs on the host
    status = run_compose("run", "--rm", "retcon-sandbox", "status", "demo/history-spec.toml",
                         env=env)
    assert "4/4 complete" in status.stdout
    # each `run --rm` is a new container: what the last one recorded is found again through
    # the state volume (its notes key), not run again
    for _ in range(2):
        verified = run_compose("run", "--rm", "retcon-sandbox", "verify",
                               "demo/history-spec.toml", env=env)
        assert "4 commits: 4 passed (4 cached)" in verified.stdout, verified.stdout


def test_a_notes_key_given_to_compose_is_the_one_its_runs_use(
        runner_base: str, project: dict[str, str], tmp_path: Path) -> None:
    """Results recorded under RETCON_SANDBOX_NOTES_KEY in one project are believed by another
    project's container (another state volume, so only the key can say they are ours)."""
    owner = os.getuid() if os.getuid() != 0 else 1234
    repo = tmp_path / "mounted"
    repo.mkdir()
    os.chown(repo, owner, owner)
    key = {"RETCON_SANDBOX_NOTES_KEY": "a-key-compose-and-ci-share-0123456789abcdef"}
    env = {"RETCON_SANDBOX_BASE_IMAGE": runner_base, "REPO": str(repo), **project, **key}
    demo = run_compose("run", "--rm", "retcon-sandbox", "demo", "--directory", "/repo/demo",
                       env=env, timeout=600)
    assert "Tree check: feature-clean == feature ✓" in demo.stdout, demo.stdout + demo.stderr
    other = {**env, "COMPOSE_PROJECT_NAME": project["COMPOSE_PROJECT_NAME"] + "-other"}
    try:
        verified = run_compose("run", "--rm", "retcon-sandbox", "verify",
                               "demo/history-spec.toml", env=other)
        assert "4 commits: 4 passed (4 cached)" in verified.stdout, verified.stdout
        without = run_compose("run", "--rm", "retcon-sandbox", "verify",
                              "demo/history-spec.toml", env={k: v for k, v in other.items()
                                                              if k not in key})
        assert "4 commits: 4 passed, in" in without.stdout, without.stdout  # claims: run again
    finally:
        run_compose("down", "--volumes", env=other, check=False)


def test_compose_refuses_a_repository_that_belongs_to_root(
        runner_base: str, project: dict[str, str], tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("only root can make a root-owned folder here")  # the owner case above runs
    repo = tmp_path / "rootrepo"
    repo.mkdir()
    env = {"RETCON_SANDBOX_BASE_IMAGE": runner_base, "REPO": str(repo), **project}
    refused = run_compose("run", "--rm", "retcon-sandbox", "version", env=env, check=False)
    assert refused.returncode == 1
    assert "belongs to root; refusing to run as root" in refused.stderr
