"""The Docker backend: the one module that imports the docker SDK.

One fresh, hardened container per logical commit: no network, a fixed non-root uid, no
capabilities, no-new-privileges, a read-only root with size-limited tmpfs for the workspace and
/tmp, pids/memory/CPU limits, no host environment and no mounts (so it works the same against a
remote engine). The helper runs as one `docker exec` whose stdin/stdout carry the protocol.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors

from retcon_sandbox import liveness
from retcon_sandbox.errors import ImageError, SandboxError
from retcon_sandbox.resources import helper_source
from retcon_sandbox.sandbox_api import HelperSandbox, ToolFailure, check_isolation
from retcon_sandbox.settings import SandboxSettings, human_bytes

LABEL_RUN = "retcon-sandbox.run"
LABEL_SPEC = "retcon-sandbox.spec"
UID = 10001
STDERR_CAP = 64 * 1024


class DockerEngine:
    """A connection to the engine at DOCKER_HOST (or the default socket)."""

    def __init__(self) -> None:
        try:
            self.client = docker.from_env(timeout=120)
            self.client.ping()
        except docker.errors.DockerException as exc:
            raise SandboxError(
                f"no Docker engine answers: {_first_line(exc)}",
                "Start the engine (`sudo systemctl start docker`, or `sudo dockerd &`), or set "
                "DOCKER_HOST; `docker info` must work. Without Docker nothing untrusted can run.",
            ) from None

    def has_image(self, name: str) -> bool:
        try:
            self.client.images.get(name)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None
        return True

    def try_pull(self, name: str) -> bool:
        repository, _, tag = name.partition(":")
        try:
            self.client.images.pull(repository, tag=tag or "latest")
        except docker.errors.DockerException:
            return False
        return True

    def build(self, context: IO[bytes], tag: str, buildargs: dict[str, str],
              labels: dict[str, str], progress: Callable[[str], None]) -> None:
        """Build from a tar of the build context (so it can come from package data)."""
        try:
            for chunk in self.client.api.build(fileobj=context, custom_context=True, tag=tag,
                                               buildargs=buildargs, labels=labels, rm=True,
                                               forcerm=True, decode=True, pull=False):
                if "error" in chunk:
                    raise ImageError(f"building {tag} failed: {chunk['error'].strip()}")
                text = str(chunk.get("stream", "")).rstrip()
                if text:
                    progress(text)
        except docker.errors.DockerException as exc:
            raise ImageError(f"building {tag} failed: {_first_line(exc)}") from None

    def image_tags(self, prefix: str) -> list[str]:
        """Every local image tag starting with `prefix`."""
        try:
            found = self.client.images.list()
        except docker.errors.DockerException as exc:
            raise ImageError(f"cannot list images: {_first_line(exc)}") from None
        return sorted(t for image in found for t in image.tags if t.startswith(prefix))

    def remove_image(self, tag: str) -> None:
        try:
            self.client.images.remove(tag)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.DockerException as exc:
            raise ImageError(f"cannot remove {tag}: {_first_line(exc)}",
                             "A container may still use it; `retcon-sandbox clean` removes "
                             "leftover sandboxes.") from None

    def image_id(self, name: str) -> str:
        """The image's content-addressed ID (sha256:…): what a tag names today."""
        try:
            return str(self.client.images.get(name).id)
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {name} is not available",
                             "Run `retcon-sandbox images build`, or name another image with "
                             "--image.") from None
        except docker.errors.DockerException as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None

    def import_rootfs(self, stream: IO[bytes], repository: str, tag: str) -> None:
        try:
            self.client.api.import_image_from_stream(stream, repository=repository, tag=tag)
        except docker.errors.DockerException as exc:
            raise ImageError(f"importing the root filesystem failed: {_first_line(exc)}") from None

    def remove_containers(self, labels: dict[str, str] | list[str]) -> int:
        if isinstance(labels, dict):
            selector = [f"{k}={v}" for k, v in labels.items()]
        else:
            selector = list(labels)
        try:
            found = self.client.containers.list(all=True, filters={"label": selector})
            for container in found:
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot list or remove containers: {_first_line(exc)}") from None
        return len(found)

    def sandbox_containers(self) -> dict[str, dict[str, str]]:
        """Every sandbox container on the engine, by id, with its labels."""
        try:
            found = self.client.containers.list(all=True, filters={"label": LABEL_RUN})
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot list containers: {_first_line(exc)}") from None
        return {str(c.id): dict(c.labels or {}) for c in found}

    def remove_container(self, container_id: str) -> None:
        try:
            self.client.containers.get(container_id).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot remove container {container_id[:12]}: "
                               f"{_first_line(exc)}") from None

    def count_containers(self, label: str) -> int:
        return len(self.client.containers.list(all=True, filters={"label": label}))


class ExecTransport:
    """The helper's stdin/stdout over a `docker exec` attach socket (multiplexed frames)."""

    def __init__(self, api: Any, exec_id: str, sock: Any) -> None:
        self._api = api
        self._exec_id = exec_id
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._sock.settimeout(None)
        self._raw = b""
        self._out = b""
        self._err = b""
        self._eof = False

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def readline(self) -> bytes:
        while b"\n" not in self._out and self._frame():
            pass
        line, sep, rest = self._out.partition(b"\n")
        if not sep:
            self._out = b""
            return line
        self._out = rest
        return line + b"\n"

    def _fill(self, n: int) -> bool:
        while len(self._raw) < n:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                self._eof = True
                return False
            self._raw += chunk
        return True

    def _frame(self) -> bool:
        if self._eof or not self._fill(8):
            return False
        size = int.from_bytes(self._raw[4:8], "big")
        if not self._fill(8 + size):
            return False
        stream, payload = self._raw[0], self._raw[8 : 8 + size]
        self._raw = self._raw[8 + size :]
        if stream == 1:
            self._out += payload
        elif len(self._err) < STDERR_CAP:
            self._err += payload
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            self._sock.close()

    def exit_code(self) -> int | None:
        try:
            code = self._api.exec_inspect(self._exec_id).get("ExitCode")
        except docker.errors.DockerException:
            return None
        return int(code) if code is not None else None

    def describe_failure(self) -> str:
        err = (self._err + self._out).decode(errors="replace").strip()[-2000:]
        return f"helper exit code {self.exit_code()}; it said: {err or '(nothing)'}"


class DockerBackend:
    name = "docker"

    def __init__(self, engine: DockerEngine, image: str, settings: SandboxSettings,
                 env: dict[str, str], spec_path: Path) -> None:
        self.engine = engine
        self.image = image
        self.settings = settings
        self.env = env
        self.spec_path = str(spec_path)
        self.run_id = uuid.uuid4().hex[:12]
        self._environment: str | None = None
        self.owner = liveness.labels_of(liveness.this_process())  # for `clean`

    def describe(self) -> str:
        s = self.settings
        return (f"docker (image {self.image}, network none, uid {UID}, memory "
                f"{human_bytes(s.memory)}, pids {s.pids})")

    def create_kwargs(self, label: str) -> dict[str, Any]:
        s = self.settings
        return {
            "image": self.image,
            "command": ["sleep", "infinity"],
            "user": f"{UID}:{UID}",
            "network_mode": "none",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {
                "/workspace": f"rw,exec,nosuid,nodev,size={int(s.workspace_size)},uid={UID},"
                              f"gid={UID},mode=0755",
                "/tmp": f"rw,exec,nosuid,nodev,size={int(s.tmp_size)},mode=1777",
            },
            "pids_limit": int(s.pids),
            "mem_limit": int(s.memory),
            "memswap_limit": int(s.memory),
            "nano_cpus": int(s.cpus * 1e9),
            "init": True,
            "ipc_mode": "private",
            "environment": {"HOME": "/tmp", **self.env},
            "working_dir": "/workspace",
            "labels": {LABEL_RUN: self.run_id, LABEL_SPEC: self.spec_path,
                       "retcon-sandbox.step": label, **self.owner},
            "stop_signal": "SIGKILL",
            "detach": True,
        }

    @contextlib.contextmanager
    def open(self, label: str) -> Iterator[HelperSandbox]:
        client = self.engine.client
        try:
            container = client.containers.create(**self.create_kwargs(label))
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {self.image} is not available",
                             "Run `retcon-sandbox images build`, or name another image with "
                             "--image.") from None
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot create a sandbox container: {_first_line(exc)}") from None
        box: HelperSandbox | None = None
        try:
            container.start()
            box = self._start_helper(str(container.id))
            yield box
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the sandbox container failed: {_first_line(exc)}") from None
        finally:
            if box is not None:
                box.close()
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)

    def _start_helper(self, container_id: str) -> HelperSandbox:
        api = self.engine.client.api
        exec_id = api.exec_create(container_id, ["python3", "-I", "-c", helper_source(),
                                                 "--workspace", "/workspace"],
                                  stdin=True, stdout=True, stderr=True, user=f"{UID}:{UID}",
                                  workdir="/workspace")["Id"]
        transport = ExecTransport(api, exec_id, api.exec_start(exec_id, socket=True))
        box = HelperSandbox(transport, self.env)
        try:
            check_isolation(box, f"the container from {self.image}")
        except (SandboxError, ToolFailure) as exc:
            if transport.exit_code() in (126, 127):
                raise SandboxError(
                    f"image {self.image} has no python3, which the in-container helper needs",
                    "Use an image with python3 (3.8 or newer), e.g. one built from images/ by "
                    "`retcon-sandbox images build`.") from None
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"the sandbox helper failed to start: {exc}") from None
        return box

    def reap(self) -> int:
        return self.engine.remove_containers({LABEL_SPEC: self.spec_path})

    def environment(self) -> str:
        """The image's ID (a rebuilt image under the same tag is another environment), and the
        variables passed in, by digest."""
        if self._environment is None:
            passed = ""
            if self.env:
                text = json.dumps(self.env, sort_keys=True).encode()
                passed = f" env:{hashlib.sha256(text).hexdigest()[:16]}"
            self._environment = f"docker {self.engine.image_id(self.image)}{passed}"
        return self._environment


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
