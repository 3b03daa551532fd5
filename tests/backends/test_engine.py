"""An engine that cannot be used ends the run at once, naming DOCKER_HOST and its value: one that
accepts connections and never answers included (no silent hang). No Docker is needed here."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from retcon_sandbox.backends.docker import endpoints
from retcon_sandbox.backends.docker.engine import DockerEngine, EngineError
from retcon_sandbox.errors import SandboxError
from tests.conftest import Demo, cli, git


@pytest.fixture
def silent_engine() -> Iterator[str]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in accepted:
        conn.close()


def test_an_engine_that_never_answers_ends_within_the_deadline(demo: Demo,
                                                               silent_engine: str) -> None:
    before = demo.spec.read_bytes()
    result = cli("execute", str(demo.spec), "--non-interactive", timeout=120,
                 env={"DOCKER_HOST": silent_engine, "RETCON_SANDBOX_ENGINE_TIMEOUT": "1"})
    assert result.code == 1, result.out + result.err
    assert f"the Docker engine at DOCKER_HOST={silent_engine} accepted the connection but did " \
        "not answer within 1 s" in result.err
    assert "RETCON_SANDBOX_ENGINE_TIMEOUT" in result.err and "Traceback" not in result.err
    assert demo.spec.read_bytes() == before
    assert git(demo.path, "branch", "--list", "feature-clean") == ""


def test_images_and_clean_end_too(silent_engine: str) -> None:
    env = {"DOCKER_HOST": silent_engine, "RETCON_SANDBOX_ENGINE_TIMEOUT": "1"}
    for command in (("images", "list"), ("clean",)):
        result = cli(*command, env=env, timeout=120)
        assert result.code == 1 and f"DOCKER_HOST={silent_engine}" in result.err, result.err


def test_no_engine_names_where_it_looked(demo: Demo) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = cli("execute", str(demo.spec), "--non-interactive", timeout=120,
                 env={"DOCKER_HOST": f"tcp://127.0.0.1:{port}"})
    assert result.code == 1, result.out + result.err
    assert f"no Docker engine answers at DOCKER_HOST=tcp://127.0.0.1:{port}:" in result.err


@pytest.mark.parametrize("value", ["0", "soon", "-1"])
def test_the_deadline_must_be_a_number_greater_than_zero(demo: Demo, value: str) -> None:
    result = cli("execute", str(demo.spec), "--non-interactive",
                 env={"RETCON_SANDBOX_ENGINE_TIMEOUT": value})
    assert result.code == 1 and f"RETCON_SANDBOX_ENGINE_TIMEOUT={value!r} is not a number" \
        in result.err, result.err


def test_the_deadline_has_a_sane_maximum(demo: Demo) -> None:
    """A deadline past what a socket can wait is refused as such, not blamed on the engine."""
    result = cli("execute", str(demo.spec), "--non-interactive",
                 env={"RETCON_SANDBOX_ENGINE_TIMEOUT": "1e15"})
    assert result.code == 1, result.out + result.err
    assert "RETCON_SANDBOX_ENGINE_TIMEOUT='1e15' is not a number greater than 0 and at most " \
        "3600" in result.err
    assert "no Docker engine" not in result.err


@pytest.mark.parametrize("host", ["tcp://1.2.3.4:99999", "tcp://[::1",
                                  "tcp://h\x1b[31m:99999"])
def test_an_address_the_sdk_cannot_parse_names_its_setting(demo: Demo, host: str) -> None:
    shown = host.replace("\x1b", "\\e")  # sanitised
    result = cli("images", "list", env={"DOCKER_HOST": host})
    assert result.code == 1 and "Traceback" not in result.err, result.out + result.err
    assert f"DOCKER_HOST={shown} is not a Docker engine address" in result.err
    assert "\x1b" not in result.err
    result = cli("execute", str(demo.spec), "--non-interactive", "--engine", host)
    assert result.code == 1 and f"--engine {shown} is not a Docker engine address" in result.err


def test_a_dead_engine_option_is_named_as_the_option() -> None:
    endpoint = endpoints.select({}, "tcp://127.0.0.1:1")
    with pytest.raises(SandboxError) as caught:
        DockerEngine(endpoint)
    assert "no Docker engine answers at --engine tcp://127.0.0.1:1" in caught.value.message
    assert "give another --engine" in caught.value.hint


class VanishingEngine(http.server.BaseHTTPRequestHandler):
    """Answers as a Docker engine would (ping, version) until `gone`, then drops every request
    without an answer: an engine lost mid-run."""

    gone = False
    answered = 0
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        if type(self).gone:
            self.connection.close()
            return
        type(self).answered += 1
        body = b"OK" if self.path.endswith("/_ping") else json.dumps(
            {"Version": "20.10.24", "ApiVersion": "1.41", "Os": "linux", "Arch": "amd64",
             "Components": [{"Name": "Engine", "Version": "20.10.24"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_engine_lost_mid_run_is_an_engine_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that breaks after the engine answered is one of our errors, not a library
    exception that would surface as an internal error."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), VanishingEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{server.server_address[1]}")
        engine = DockerEngine()
        assert VanishingEngine.answered >= 2  # ping and version at least
        VanishingEngine.gone = True
        with pytest.raises(SandboxError) as raised:
            engine.image_tags("retcon-sandbox/")
        assert "cannot list images" in raised.value.message
        # how a command ended is never made up from a failed request (it was "killed by
        # signal 9", a failing verdict recorded in the spec)
        with pytest.raises(EngineError):
            engine.exec_exit_code("0123abcd")
    finally:
        server.shutdown()
        server.server_close()


def test_the_docker_sdk_is_imported_only_when_an_engine_is_used() -> None:
    """A command that fails validation never reaches an engine: it starts without the SDK."""
    probe = ("import sys\n"
             "from retcon_sandbox.commands import execute, verify\n"
             "from retcon_sandbox.backends.docker.engine import DockerEngine, engine_errors\n"
             "print(sorted(m for m in ('docker', 'requests') if m in sys.modules))\n"
             "engine_errors()\n"
             "print(sorted(m for m in ('docker', 'requests') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["[]", "['docker', 'requests']"]


@pytest.mark.parametrize("source", ["DOCKER_HOST", "--engine"])
def test_a_dead_remote_engine_is_named_as_remote_not_a_daemon_to_start(source: str) -> None:
    """An engine on another machine: `sudo systemctl start docker` here would not help."""
    host = "tcp://engine.invalid:2376"
    endpoint = endpoints.select({"DOCKER_HOST": host}, None) if source == "DOCKER_HOST" else \
        endpoints.select({}, host)
    with pytest.raises(SandboxError) as caught:
        DockerEngine(endpoint)
    where = f"DOCKER_HOST={host}" if source == "DOCKER_HOST" else f"--engine {host}"
    assert caught.value.message.startswith(f"the remote Docker engine at {where} cannot be "
                                           "reached: ")
    hint = caught.value.hint
    assert "runs on another machine (engine.invalid)" in hint and "systemctl" not in hint
    assert f"`docker -H {host} info` must work" in hint and f"another {source}" in hint


@pytest.mark.parametrize("host", ["tcp://127.0.0.1:1", "tcp://localhost:1", "tcp://[::1]:1"])
def test_a_dead_local_engine_still_says_to_start_it(host: str) -> None:
    with pytest.raises(SandboxError) as caught:
        DockerEngine(endpoints.select({}, host))
    assert "no Docker engine answers at --engine" in caught.value.message
    assert "Start the engine" in caught.value.hint
