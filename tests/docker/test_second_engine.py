"""A second Docker engine, over tcp://127.0.0.1: a `dockerd` of this test's own (its own data
root, exec root, pidfile and socket under a temporary folder, a bridge of its own and no
iptables, so it does not touch the main engine's: with `--bridge=none` a dockerd deletes the
interface `docker0`, the main engine's bridge), with the base image loaded from the main engine
(`docker save | docker load`: no registry is needed). Its storage driver is the main engine's
own, else fuse-overlayfs, else vfs: the first with which it starts. `verify` runs on it alone,
then spreads its sandboxes over both engines; an engine that lacks the image is named, with the
command that loads it.

It skips only where there is no `dockerd` to start; under CI (CI=true) it never skips, and a
daemon that cannot start fails the test with its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.backends.docker import endpoints, sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.errors import SandboxError
from tests.conftest import Demo, cli, make_demo

START_S = 60.0


@dataclass(frozen=True)
class Second:
    host: str  # tcp://127.0.0.1:PORT
    engine: DockerEngine
    root: Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def own_bridge() -> Iterator[str]:
    """A bridge interface for the second daemon (with an address of a range Docker does not
    use by default), deleted afterwards."""
    name = f"rsdd{os.getpid() % 100_000}"
    ip = shutil.which("ip")
    assert ip is not None, "iproute2's `ip` makes the second daemon's bridge"
    subprocess.run([ip, "link", "add", name, "type", "bridge"], check=True)
    try:
        subnet = os.getpid() % 250 + 1  # test workers side by side: bridges of their own
        subprocess.run([ip, "addr", "add", f"10.254.{subnet}.1/24", "dev", name], check=True)
        subprocess.run([ip, "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run([ip, "link", "delete", name], check=False)


def dockerd_argv(dockerd: str, root: Path, port: int, driver: str, bridge: str) -> list[str]:
    (root / "daemon.json").write_text("{}")  # not the main engine's /etc/docker/daemon.json
    return [dockerd, "--config-file", str(root / "daemon.json"),
            "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{root}/docker.sock",
            "-H", f"tcp://127.0.0.1:{port}", f"--bridge={bridge}", "--iptables=false",
            "--ip-masq=false", "--storage-driver", driver]


def wait_ready(host: str, proc: subprocess.Popen[bytes]) -> DockerEngine | None:
    """The engine once it answers; None if the daemon exits first or never answers."""
    endpoint = endpoints.select(given=host)
    deadline = time.monotonic() + START_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            return DockerEngine(endpoint)
        except SandboxError:
            time.sleep(0.5)
    return None


def drivers(engine: DockerEngine) -> list[str]:
    """The storage drivers to try: the main engine's own (what works on this machine), then
    fuse-overlayfs where it is installed, then vfs (slow, but works anywhere)."""
    found = [str(engine.client.info().get("Driver") or "")]
    if shutil.which("fuse-overlayfs"):
        found.append("fuse-overlayfs")
    return [d for d in dict.fromkeys([*found, "vfs"]) if d]


def stop(proc: subprocess.Popen[bytes], root: Path) -> None:
    """The daemon, its containerd and anything left in its session, then its mounts and
    folders."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # its session: containerd, if still there
        os.killpg(proc.pid, signal.SIGKILL)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(root))]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def second(engine: DockerEngine) -> Iterator[Second]:
    """A second engine, started here; stopped, and its data root removed, afterwards."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the second-engine test, but `dockerd` is not installed")
        pytest.skip("no `dockerd` here to start a second engine with")
    logs: list[str] = []
    with own_bridge() as bridge:
        for driver in drivers(engine):
            root = Path(tempfile.mkdtemp(prefix="retcon-dockerd-", dir="/tmp"))  # short: socket
            port = free_port()
            log = root / "dockerd.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(dockerd_argv(dockerd, root, port, driver, bridge),
                                        stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                ready = wait_ready(f"tcp://127.0.0.1:{port}", proc)
                if ready is not None:
                    yield Second(f"tcp://127.0.0.1:{port}", ready, root)
                    return
                logs.append(f"--- storage driver {driver}: exit {proc.poll()}\n"
                            + log.read_text(errors="replace")[-3000:])
            finally:
                stop(proc, root)
                assert proc.poll() is not None and not root.exists()
    pytest.fail("a second dockerd could not start with any storage driver:\n" + "\n".join(logs))


@pytest.fixture(scope="module")
def loaded(engine: DockerEngine, second: Second) -> Second:
    """The second engine, holding the main engine's base image (the same ID)."""
    tag = sandboximages.default_image()
    docker = shutil.which("docker")
    assert docker is not None, "the docker CLI loads the image into the second engine"
    save = subprocess.Popen([docker, "-H", engine.endpoint.host, "save", tag],
                            stdout=subprocess.PIPE)
    load = subprocess.run([docker, "-H", second.host, "load"], stdin=save.stdout,
                          capture_output=True, text=True, check=False)
    assert save.stdout is not None
    save.stdout.close()
    assert save.wait() == 0 and load.returncode == 0, load.stderr
    assert second.engine.image_id(tag) == engine.image_id(tag)
    return second


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return make_demo(tmp_path_factory.mktemp("second") / "repo", with_paths=True)


def test_an_engine_without_the_image_is_named_with_the_command_to_load_it(
        engine: DockerEngine, second: Second, project: Demo) -> None:
    if second.engine.has_image(sandboximages.default_image()):
        pytest.skip("the image is already loaded (the tests ran out of order)")
    result = cli("verify", "main..feature", "--build", "true", "--engine", engine.endpoint.host,
                 "--engine", second.host, cwd=project.path)
    assert result.code == 1, result.out + result.err
    assert f"the engine {second.host} (--engine) has no image {sandboximages.default_image()}" \
        in result.err
    assert f"DOCKER_HOST={second.host} docker load" in result.err
    assert f"DOCKER_HOST={second.host} retcon-sandbox images build" in result.err


def test_verify_on_the_second_engine_alone(loaded: Second, project: Demo) -> None:
    result = cli("verify", "feature~4..feature", "--spec", str(project.spec), "--engine",
                 loaded.host, "--no-cache", "--json", cwd=project.path)
    assert result.code == 0, result.out + result.err
    found = events(result.out)
    assert found[0]["event"] == "verify_start"
    assert found[0]["engine"] == f"{loaded.host} (--engine)"
    verified = [e for e in found if e["event"] == "commit_verified"]
    assert len(verified) == 4 and all(e["tests"] == "PASS" for e in verified)
    [phases] = [e for e in found if e["event"] == "verify_phases"]
    assert phases["engines"] == {f"{loaded.host} (--engine)": 4}
    assert not loaded.engine.client.containers.list(all=True)  # every sandbox removed


def test_verify_spreads_its_sandboxes_over_two_engines(engine: DockerEngine, loaded: Second,
                                                        project: Demo) -> None:
    main = engine.endpoint.host
    result = cli("verify", "main..feature", "--spec", str(project.spec), "--engine", main,
                 "--engine", loaded.host, "-j", "2", "--no-cache", "--json", cwd=project.path)
    assert result.code == 3, result.out + result.err  # the messy branch: 2 commits fail
    found = events(result.out)
    assert found[0]["engine"] == f"{main} (--engine) + {loaded.host} (--engine)"
    verified = [e for e in found if e["event"] == "commit_verified"]
    assert len(verified) == 10
    assert sorted(e["number"] for e in verified if not e["passed"]) == [3, 5]
    [phases] = [e for e in found if e["event"] == "verify_phases"]
    spread = phases["engines"]
    assert set(spread) == {f"{main} (--engine)", f"{loaded.host} (--engine)"}
    assert all(count >= 1 for count in spread.values()) and sum(spread.values()) == 10
    assert not loaded.engine.client.containers.list(all=True)


def test_execute_refuses_two_engines(engine: DockerEngine, second: Second,
                                     tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    result = cli("execute", str(demo.spec), "--non-interactive", "--engine",
                 engine.endpoint.host, "--engine", second.host)
    assert result.code == 2, result.out + result.err
    assert "--engine is given 2 times: this command runs one sandbox at a time" in result.err
