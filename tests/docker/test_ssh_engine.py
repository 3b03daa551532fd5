"""An engine reached over SSH (DOCKER_HOST=ssh://…, the `ssh` extra), for real: an OpenSSH
server on loopback, started for these tests with keys of their own, in front of the same
engine. The whole demo is reconstructed through it. Without sshd (openssh-server) the tests
skip, except in CI, where .ci/run installs it and they must run."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Demo, cli


@dataclass(frozen=True)
class SshEngine:
    host: str  # the DOCKER_HOST value
    env: dict[str, str]  # HOME with the client's key, config and known host


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def keygen(path: Path) -> str:
    """A new ed25519 key pair at `path` (and path.pub): the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def sshd_binary() -> str:
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd")
                                     else None)
    if found is None or shutil.which("ssh-keygen") is None:
        if os.environ.get("CI"):
            pytest.fail("sshd is not installed (openssh-server): CI must install it")
        pytest.skip("sshd is not installed (openssh-server)")
    return found


def client_home(home: Path, port: int, host_key: str) -> None:
    dot = home / ".ssh"
    dot.mkdir(parents=True, mode=0o700)
    keygen(dot / "id_ed25519")
    (dot / "config").write_text(f"Host 127.0.0.1\n  IdentityFile {dot / 'id_ed25519'}\n")
    (dot / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key.split()[:2])}\n")


def wait_for_port(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"sshd exited: {log.read_text(errors='replace')}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"sshd did not listen in 30 s: {log.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def ssh_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshEngine]:
    sshd = sshd_binary()
    pytest.importorskip("paramiko", reason="the `ssh` extra (paramiko) is a test dependency")
    where = tmp_path_factory.mktemp("sshd")
    port = free_port()
    host_key = keygen(where / "host_key")
    home = where / "home"
    client_home(home, port, host_key)
    (where / "authorized_keys").write_text((home / ".ssh" / "id_ed25519.pub").read_text())
    (where / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {where / 'host_key'}\n"
        f"AuthorizedKeysFile {where / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n"
        f"PidFile {where / 'sshd.pid'}\nUsePAM no\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation needs it (as root)
    log = where / "sshd.log"
    server = subprocess.Popen([sshd, "-D", "-e", "-f", str(where / "sshd_config")],
                              stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        wait_for_port(port, server, log)
        user = getpass.getuser()
        yield SshEngine(f"ssh://{user}@127.0.0.1:{port}",
                        {"HOME": str(home), "DOCKER_HOST": f"ssh://{user}@127.0.0.1:{port}"})
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_demo_is_reconstructed_through_an_ssh_engine(ssh_engine: SshEngine,
                                                         demo: Demo) -> None:
    result = cli("execute", str(demo.spec), "--non-interactive", env=ssh_engine.env)
    assert result.code == 0, result.out + result.err
    assert f"  Engine: {ssh_engine.host} (DOCKER_HOST)\n" in result.out
    assert "Tree check: cleaned == source ✓" in result.out
    assert demo.git("rev-parse", "feature-clean^{tree}") == \
        demo.git("rev-parse", "feature^{tree}")


def test_an_unknown_host_key_is_refused(ssh_engine: SshEngine, demo: Demo,
                                        tmp_path: Path) -> None:
    """The server's key is checked against known_hosts: a server we do not know is not
    trusted, and the error says which engine could not be used."""
    known = Path(ssh_engine.env["HOME"]) / ".ssh" / "known_hosts"
    elsewhere = tmp_path / "home"
    shutil.copytree(Path(ssh_engine.env["HOME"]), elsewhere)
    (elsewhere / ".ssh" / "known_hosts").write_text("")
    result = cli("verify", "main..feature", "--build", "true", cwd=demo.path,
                 env={**ssh_engine.env, "HOME": str(elsewhere)})
    assert result.code == 1, result.out + result.err
    assert f"no Docker engine answers at DOCKER_HOST={ssh_engine.host}" in result.err
    assert "known_hosts" in result.err and "internal error" not in result.err
    assert known.read_text()  # the fixture's own trust is untouched


def test_an_ssh_engine_that_does_not_answer_is_named(ssh_engine: SshEngine, demo: Demo) -> None:
    host = f"ssh://{getpass.getuser()}@127.0.0.1:{free_port()}"  # nothing listens there
    result = cli("verify", "main..feature", "--build", "true", cwd=demo.path,
                 env={**ssh_engine.env, "DOCKER_HOST": host})
    assert result.code == 1, result.out + result.err
    assert f"no Docker engine answers at DOCKER_HOST={host}" in result.err
    assert "internal error" not in result.err
