"""The Docker backend: the one module that imports the docker SDK.

One fresh, hardened container per logical commit: no network, fixed non-root uids, no
capabilities, no-new-privileges, a read-only root with size-limited tmpfs for the workspace and
/tmp (and over any VOLUME the image declares), pids/memory/CPU limits, no host environment, no
mounts (so it works the same against a remote engine), and the image's ENTRYPOINT overridden.
The helper runs as one `docker exec` (uid 10001) whose stdin/stdout carry the protocol; each
build or test runs in an exec of its own under another uid (10002), so it can neither signal,
trace nor reach the helper's pipes, and every process it leaves is killed when it ends.
"""

from __future__ import annotations

import contextlib
import io
import socket
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import docker.types

from retcon_sandbox import userkey
from retcon_sandbox.backends import liveness
from retcon_sandbox.backends.api import (
    COMMAND_MARGIN_S,
    LINE_CAP,
    CommandResult,
    DeadlineExceeded,
    HelperSandbox,
    OutputCapture,
    ToolFailure,
    check_isolation,
)
from retcon_sandbox.errors import ImageError, SandboxError
from retcon_sandbox.resources import egress_source, helper_source
from retcon_sandbox.spec.settings import SandboxSettings, human_bytes

LABEL_RUN = "retcon-sandbox.run"
LABEL_SPEC = "retcon-sandbox.spec"
UID = 10001  # the helper: file tools
COMMAND_UID = 10002  # builds and tests: cannot signal, trace or read the helper
GID = 10000  # shared by both, on /workspace (setgid, group-writable)
STDERR_CAP = 64 * 1024
FRAME_CAP = 64 * 1024 * 1024
KILL_GRACE_S = 10.0
PROXY_PORT = 3128
PROXY_ALIAS = "retcon-proxy"
PROXY_READY_S = 20.0
CA_PATH = "/etc/retcon-sandbox/ca.pem"  # the host's CA bundle, in a setup container only
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS",
                "NPM_CONFIG_CAFILE", "CARGO_HTTP_CAINFO", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE")
# The helper runs on the image's system interpreter, in isolated mode without `site`, never on
# one found through PATH: setup (the repository's code, as COMMAND_UID) may rewrite the virtual
# environment PATH names first, and what it leaves is kept in the prepared image.
PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")  # in PATH's usual order
_LAUNCH = (f"for p in {' '.join(PYTHONS)}; do if [ -x \"$p\" ]; then exec \"$p\" -I -S \"$@\"; "
           f"fi; done; echo 'retcon-sandbox: no python3 in /usr/local/bin or /usr/bin' >&2; "
           "exit 127")
# Setup's embedded DNS forwards to an address that leads nowhere: names are resolved by the
# egress proxy alone (older engines forwarded internal networks' queries, CVE-2024-29018).
NO_DNS = "192.0.2.1"


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

    def is_running(self, container_id: str) -> bool:
        try:
            return bool(self.client.containers.get(container_id).attrs["State"]["Running"])
        except docker.errors.DockerException:
            return False

    def image_labels(self, name: str) -> dict[str, str]:
        try:
            config = self.client.images.get(name).attrs.get("Config") or {}
        except docker.errors.ImageNotFound:
            return {}
        except docker.errors.DockerException as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None
        return {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}

    def image_volumes(self, name: str) -> list[str]:
        """The paths an image declares as VOLUMEs."""
        try:
            config = self.client.images.get(name).attrs.get("Config") or {}
        except docker.errors.ImageNotFound:
            return []
        except docker.errors.DockerException as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None
        return sorted((config.get("Volumes") or {}).keys())

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
            found = self.client.containers.list(all=True, ignore_removed=True,
                                                filters={"label": selector})
            for container in found:
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True, v=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot list or remove containers: {_first_line(exc)}") from None
        return len(found)

    def remove_networks(self, labels: dict[str, str]) -> None:
        """The setup networks a killed run left (with their containers gone)."""
        for network_id in self.sandbox_networks(labels):
            self.remove_network(network_id)

    def sandbox_networks(self, labels: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        """The setup networks on the engine (those of runs on one spec, with `labels`)."""
        selector = [f"{k}={v}" for k, v in labels.items()] if labels else [LABEL_RUN]
        try:
            found = self.client.networks.list(filters={"label": selector})
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot list networks: {_first_line(exc)}") from None
        return {str(n.id): dict(n.attrs.get("Labels") or {}) for n in found}

    def remove_network(self, network_id: str) -> None:
        """A network still in use (its run is alive) stays."""
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.networks.get(network_id).remove()

    def sandbox_containers(self) -> dict[str, dict[str, str]]:
        """Every sandbox container on the engine, by id, with its labels."""
        try:
            found = self.client.containers.list(all=True, ignore_removed=True,
                                                filters={"label": LABEL_RUN})
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot list containers: {_first_line(exc)}") from None
        return {str(c.id): dict(c.labels or {}) for c in found}

    def remove_container(self, container_id: str) -> None:
        try:
            self.client.containers.get(container_id).remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot remove container {container_id[:12]}: "
                               f"{_first_line(exc)}") from None

    def count_containers(self, label: str) -> int:
        return len(self.client.containers.list(all=True, ignore_removed=True,
                                               filters={"label": label}))


class ExecStream:
    """A `docker exec` attach socket, demultiplexed (frames of stream 1 = stdout, 2 = stderr)
    in linear time, every wait bounded by the deadline in force."""

    def __init__(self, sock: Any) -> None:
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.deadline: float | None = None
        self._buf = bytearray()
        self._pos = 0

    def frame(self) -> tuple[int, bytes] | None:
        """The next frame, or None at end of stream."""
        header = self._take(8)
        if header is None:
            return None
        size = int.from_bytes(header[4:8], "big")
        if size > FRAME_CAP:
            raise SandboxError(f"the sandbox sent a frame of {size} bytes (at most {FRAME_CAP})")
        payload = self._take(size)
        return None if payload is None else (header[0], payload)

    def send(self, data: bytes) -> None:
        self._wait_budget()
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise DeadlineExceeded("the sandbox stopped reading its input") from None

    def _take(self, n: int) -> bytes | None:
        while len(self._buf) - self._pos < n:
            if not self._recv():
                return None
        data = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        if self._pos > (1 << 20) and 2 * self._pos > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        return data

    def _recv(self) -> bool:
        self._wait_budget()
        try:
            chunk = self.sock.recv(1 << 16)
        except TimeoutError:
            raise DeadlineExceeded("the sandbox did not answer in time") from None
        if not chunk:
            return False
        self._buf += chunk
        return True

    def _wait_budget(self) -> None:
        if self.deadline is None:
            self.sock.settimeout(None)
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the sandbox did not answer in time")
        self.sock.settimeout(left)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            self.sock.close()


class ExecTransport:
    """The helper's stdin/stdout over its `docker exec`: lines found in linear time, none
    longer than LINE_CAP, stderr kept (capped) for error messages."""

    def __init__(self, api: Any, exec_id: str, sock: Any) -> None:
        self._api = api
        self._exec_id = exec_id
        self._stream = ExecStream(sock)
        self._out = bytearray()
        self._scanned = 0
        self._err = bytearray()

    def set_deadline(self, deadline: float | None) -> None:
        self._stream.deadline = deadline

    def send(self, data: bytes) -> None:
        self._stream.send(data)

    def readline(self) -> bytes:
        while True:
            end = self._out.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._out[: end + 1])
                del self._out[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._out)
            if len(self._out) > LINE_CAP:
                raise SandboxError(f"the sandbox helper sent a line over {LINE_CAP} bytes")
            frame = self._stream.frame()
            if frame is None:
                line = bytes(self._out)
                self._out.clear()
                return line
            stream, payload = frame
            if stream == 1:
                self._out += payload
            elif len(self._err) < STDERR_CAP:
                self._err += payload[: STDERR_CAP - len(self._err)]

    def close(self) -> None:
        self._stream.close()

    def exit_code(self) -> int | None:
        return _exec_exit_code(self._api, self._exec_id)

    def describe_failure(self) -> str:
        err = (self._err + self._out[-2000:]).decode(errors="replace").strip()[-2000:]
        return f"helper exit code {self.exit_code()}; it said: {err or '(nothing)'}"


def _exec_exit_code(api: Any, exec_id: str) -> int | None:
    try:
        info = api.exec_inspect(exec_id)
    except docker.errors.DockerException:
        return None
    code = info.get("ExitCode")
    return None if info.get("Running") or code is None else int(code)


class DockerSandbox(HelperSandbox):
    """File tools through the helper; each command in a `docker exec` of its own, under the
    commands' uid, read and capped by the host (see `DockerBackend.run_command`)."""

    def __init__(self, transport: ExecTransport, backend: DockerBackend, container_id: str,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(transport, backend.env if env is None else env)
        self._backend = backend
        self.container_id = container_id

    def run(self, command: str, timeout: float,
            on_output: Callable[[bytes], None] | None = None) -> CommandResult:
        result = self._backend.run_command(self.container_id, command, timeout, self._env,
                                           on_output)
        if result.exit_code >= 126 or result.exit_code < 0:
            self._still_alive(command)
        return result

    def prepare_workspace(self, git: bool, tag: str | None) -> CommandResult:
        """The git metadata (a repository of one commit, tagged `tag`), then what a setup left
        in the workspace: as the commands' uid, which then owns them."""
        args = ["--prepare", *(["--git"] if git else []), *(["--tag", tag] if tag else [])]
        return self._backend.run_command(self.container_id, "prepare the workspace",
                                         COMMAND_MARGIN_S * 4, self._env, helper_args=args)

    def snapshot(self) -> CommandResult:
        return self._backend.run_command(self.container_id, "keep what setup made",
                                         COMMAND_MARGIN_S * 20, self._env,
                                         helper_args=["--snapshot"])

    def _still_alive(self, command: str) -> None:
        """A command that could not run (126, 127: also what a failed exec reports) or was
        killed by a signal: was the whole sandbox killed (removed by `clean`, the engine
        stopping)? Then that is the failure, not the command's."""
        try:
            self.hello()
        except (SandboxError, ToolFailure):
            raise SandboxError(f"the sandbox container stopped while `{command}` ran",
                               "Was it removed (`retcon-sandbox clean --all`, `docker rm`), or "
                               "did the engine stop? Rerun to resume.") from None


class DockerBackend:
    name = "docker"

    def __init__(self, engine: DockerEngine, image: str, settings: SandboxSettings,
                 env: dict[str, str], spec_path: Path, proxy_image: str | None = None) -> None:
        """`proxy_image`: our own base image, which setup's egress proxy runs from."""
        self.engine = engine
        self.image = image
        self.proxy_image = proxy_image
        self.settings = settings
        self.env = env
        self.spec_path = str(spec_path)
        self.run_id = uuid.uuid4().hex[:12]
        self._environment: str | None = None
        self._volumes: list[str] | None = None
        self.owner = liveness.labels_of(liveness.this_process())  # for `clean`
        self.proxy_log: Callable[[], str] = lambda: ""  # the last setup's egress decisions

    def describe(self) -> str:
        s = self.settings
        return (f"docker (image {self.image}, network none, uids {UID}/{COMMAND_UID}, memory "
                f"{human_bytes(s.memory)}, pids {s.pids})")

    def create_kwargs(self, label: str, image: str | None = None) -> dict[str, Any]:
        s = self.settings
        return {
            "image": image or self.image,
            "entrypoint": ["sleep"],  # the image's ENTRYPOINT never runs
            "command": ["infinity"],
            "user": f"{UID}:{GID}",
            "network_mode": "none",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {
                **self._shadowed_volumes(),
                "/workspace": f"rw,exec,nosuid,nodev,size={int(s.workspace_size)},uid={UID},"
                              f"gid={GID},mode=2775",
                "/tmp": f"rw,exec,nosuid,nodev,size={int(s.tmp_size)},mode=1777",
            },
            "pids_limit": int(s.pids),
            "mem_limit": int(s.memory),
            "memswap_limit": int(s.memory),
            "nano_cpus": int(s.cpus * 1e9),
            "init": True,
            "ipc_mode": "private",
            "environment": {"HOME": "/tmp"},  # --pass-env reaches each command's exec only
            "working_dir": "/workspace",
            "labels": {LABEL_RUN: self.run_id, LABEL_SPEC: self.spec_path,
                       "retcon-sandbox.step": label, **self.owner},
            "stop_signal": "SIGKILL",
            "detach": True,
        }

    def _shadowed_volumes(self) -> dict[str, str]:
        """An image's VOLUMEs would be anonymous volumes on the host's disk, uncapped and left
        behind: each is covered by a small tmpfs instead."""
        if self._volumes is None:
            self._volumes = self.engine.image_volumes(self.image)
        size = int(self.settings.tmp_size)
        return {path: f"rw,nosuid,nodev,size={size},mode=1777" for path in self._volumes
                if path not in ("/workspace", "/tmp")}

    @contextlib.contextmanager
    def open(self, label: str, image: str | None = None) -> Iterator[DockerSandbox]:
        """A fresh sandbox from `image` (a prepared environment) or the run's image."""
        with self._sandbox(self.create_kwargs(label, image)) as box:
            yield box

    @contextlib.contextmanager
    def open_setup(self, label: str, network: str, registries: tuple[str, ...],
                   ca_bundle: bytes | None) -> Iterator[DockerSandbox]:
        """A sandbox for `[sandbox] setup`: hardened like any other, but its root is writable
        (it becomes the prepared image) and it has the network `network` names: `registries`
        (an internal network whose only way out is the egress proxy), `full` or `none`. The
        variables naming the proxy and the host's CA bundle reach the setup's commands only;
        the bundle's file (public certificates) stays in the image at CA_PATH."""
        with contextlib.ExitStack() as stack:
            kwargs = {**self.create_kwargs(label), "read_only": False}
            env = dict(self.env)
            if network == "registries":
                kwargs.pop("network_mode")
                kwargs["network"], proxy = stack.enter_context(self._egress(registries))
                kwargs["dns"] = [NO_DNS]
                env.update(proxy_variables(proxy))
            elif network == "full":
                kwargs["network_mode"] = "bridge"
            if ca_bundle is not None:
                env.update(dict.fromkeys(CA_VARIABLES, CA_PATH))
            box = stack.enter_context(self._sandbox(kwargs, env, ca_bundle,
                                                    network_allowed=network != "none"))
            yield box

    def commit_image(self, box: DockerSandbox, repository: str, tag: str,
                     labels: dict[str, str]) -> None:
        """The setup container as an image (its tmpfs mounts are not part of it)."""
        try:
            container = self.engine.client.containers.get(box.container_id)
            container.commit(repository=repository, tag=tag, conf={"Labels": labels})
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot keep the prepared environment as {repository}:{tag}: "
                               f"{_first_line(exc)}") from None

    @contextlib.contextmanager
    def _sandbox(self, kwargs: dict[str, Any], env: dict[str, str] | None = None,
                 ca_bundle: bytes | None = None, network_allowed: bool = False
                 ) -> Iterator[DockerSandbox]:
        client = self.engine.client
        image = str(kwargs["image"])
        try:
            container = client.containers.create(**kwargs)
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {image} is not available",
                             "Run `retcon-sandbox images build`, or name another image with "
                             "--image.") from None
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot create a sandbox container: {_first_line(exc)}") from None
        box: DockerSandbox | None = None
        try:
            if ca_bundle is not None:
                container.put_archive("/", _ca_tar(ca_bundle))
            container.start()
            box = self._start_helper(str(container.id), image, env, network_allowed)
            yield box
        except docker.errors.DockerException as exc:
            raise SandboxError(f"the sandbox container failed: {_first_line(exc)}") from None
        finally:
            if box is not None:
                box.close()
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True, v=True)

    @contextlib.contextmanager
    def _egress(self, registries: tuple[str, ...]) -> Iterator[tuple[str, str]]:
        """An internal network whose only way out is the egress proxy (`sandbox/egress.py`),
        itself on an ordinary network: (the internal network's name, the proxy's URL). The
        internal network's bridge has no address on the host (`inhibit_ipv4`), so nothing
        listening on the host is reachable from it. The proxy runs from our own base image,
        never the run's (which a spec names, and which setup may have changed)."""
        client = self.engine.client
        image = self.proxy_image
        if image is None or not self.engine.has_image(image):
            raise ImageError("setup's egress proxy runs from retcon-sandbox/base, which is not "
                             "built", "Run `retcon-sandbox images build base`, or give "
                             "--setup-network full (or none).")
        labels = {LABEL_RUN: self.run_id, LABEL_SPEC: self.spec_path, **self.owner}
        suffix = uuid.uuid4().hex[:10]
        with contextlib.ExitStack() as stack:
            try:
                outside = client.networks.create(f"retcon-egress-{suffix}", driver="bridge",
                                                 labels=labels)
                stack.callback(_quietly, outside.remove)
                inside = client.networks.create(
                    f"retcon-setup-{suffix}", driver="bridge", internal=True, labels=labels,
                    enable_ipv6=False,
                    options={"com.docker.network.bridge.inhibit_ipv4": "true"})
                stack.callback(_quietly, inside.remove)
                proxy = client.containers.create(
                    image=image, entrypoint=["/usr/bin/python3"],  # our base's
                    command=["-I", "-S", "-c", egress_source(), str(PROXY_PORT), *registries],
                    user=f"{UID}:{GID}", network=outside.name, cap_drop=["ALL"],
                    security_opt=["no-new-privileges"], read_only=True,
                    tmpfs={"/tmp": "rw,nosuid,nodev,size=16m"}, pids_limit=64,
                    mem_limit=256 * 1024 * 1024, nano_cpus=500_000_000, init=True,
                    environment={}, log_config=docker.types.LogConfig(
                        type="json-file", config={"max-size": "1m", "max-file": "1"}),
                    labels={**labels, "retcon-sandbox.step": "egress proxy"}, detach=True)
                stack.callback(_quietly, lambda: proxy.remove(force=True, v=True))
                inside.connect(proxy, aliases=[PROXY_ALIAS])
                proxy.start()
                _wait_listening(proxy)
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot set up the setup's network: {_first_line(exc)}",
                                   "The engine must be able to create networks; or give "
                                   "--setup-network full (or none).") from None
            self.proxy_log = lambda: _logs(proxy)
            yield str(inside.name), f"http://{PROXY_ALIAS}:{PROXY_PORT}"

    def _start_helper(self, container_id: str, image: str | None = None,
                      env: dict[str, str] | None = None, network_allowed: bool = False
                      ) -> DockerSandbox:
        api = self.engine.client.api
        image = image or self.image
        exec_id = api.exec_create(container_id, helper_argv(*(["--network-allowed"]
                                                              if network_allowed else [])),
                                  stdin=True, stdout=True, stderr=True, user=f"{UID}:{GID}",
                                  workdir="/workspace")["Id"]
        transport = ExecTransport(api, exec_id, api.exec_start(exec_id, socket=True))
        box = DockerSandbox(transport, self, container_id, env)
        try:
            check_isolation(box, f"the container from {image}")
        except (SandboxError, ToolFailure) as exc:
            if transport.exit_code() in (126, 127):
                raise SandboxError(
                    f"image {image} has no /usr/local/bin/python3 or /usr/bin/python3 (or no "
                    "/bin/sh), which the in-container helper needs",
                    "Use an image with python3 (3.8 or newer), e.g. one built from images/ by "
                    "`retcon-sandbox images build`.") from None
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"the sandbox helper failed to start: {exc}") from None
        return box

    # -- commands: one exec each, under the commands' uid ---------------------------------

    def run_command(self, container_id: str, command: str, timeout: float,
                    env: dict[str, str] | None = None,
                    on_output: Callable[[bytes], None] | None = None,
                    helper_args: list[str] | None = None) -> CommandResult:
        """Run `command` in its own exec as COMMAND_UID, which cannot reach the helper. The
        host reads and caps its output; past the timeout plus a margin, every process of that
        uid is killed; if even that fails, the container is removed (SandboxError).
        `helper_args`: one of the helper's own modes (--prepare, --snapshot) instead."""
        started = time.monotonic()
        argv = helper_args if helper_args is not None else ["--run", str(timeout), command]
        exec_id, stream = self._exec_command(container_id, argv,
                                             self.env if env is None else env)
        capture = OutputCapture()
        stream.deadline = started + timeout + COMMAND_MARGIN_S
        overdue = False
        try:
            overdue = _pump(stream, capture, on_output)
            if overdue:
                self._kill_commands(container_id)
                stream.deadline = time.monotonic() + KILL_GRACE_S
                if _pump(stream, capture, on_output):
                    raise SandboxError(f"`{command}` did not stop after its {timeout:.0f} s "
                                       "timeout, even when killed; the sandbox was removed",
                                       "Rerun to resume; the commit is verified again.")
        finally:
            stream.close()
        code = _exec_exit_code(self.engine.client.api, exec_id)
        if code is None or code >= 128:  # the supervisor itself may have been killed
            self._kill_commands(container_id)
        seconds = time.monotonic() - started
        timed_out = overdue or (code == TIMED_OUT and seconds >= timeout)
        return CommandResult(command, -9 if code is None else code, timed_out, capture.text(),
                             capture.total, capture.truncated, round(seconds, 3))

    def _exec_command(self, container_id: str, argv: list[str], env: dict[str, str]
                      ) -> tuple[str, ExecStream]:
        api = self.engine.client.api
        try:
            exec_id = api.exec_create(
                container_id, helper_argv(*argv),
                stdin=False, stdout=True, stderr=True, user=f"{COMMAND_UID}:{GID}",
                workdir="/workspace",
                environment={**env, "RETCON_SANDBOX_SUPERVISE": "1"})["Id"]
            return exec_id, ExecStream(api.exec_start(exec_id, socket=True))
        except docker.errors.DockerException as exc:
            if not self.engine.is_running(container_id):
                raise SandboxError("the sandbox container stopped before a command could start",
                                   "Was it removed (`retcon-sandbox clean --all`, `docker rm`), "
                                   "or did the engine stop? Rerun to resume.") from None
            raise SandboxError(f"the sandbox could not start a command: {_first_line(exc)}"
                               ) from None

    def _kill_commands(self, container_id: str) -> None:
        """SIGKILL every process of the commands' uid (`kill -9 -1` spares only the caller)."""
        api = self.engine.client.api
        try:
            exec_id = api.exec_create(container_id, ["/bin/sh", "-c", "kill -9 -1"],
                                      user=f"{COMMAND_UID}:{GID}")["Id"]
            api.exec_start(exec_id)
        except (docker.errors.NotFound, docker.errors.APIError) as exc:
            if not self.engine.is_running(container_id):
                raise SandboxError("the sandbox container stopped while a command ran",
                                   "Was it removed (`retcon-sandbox clean --all`, `docker "
                                   "rm`)? Rerun to resume.") from None
            raise SandboxError(f"the sandbox could not stop its commands: {_first_line(exc)}; "
                               "it was removed", "Rerun to resume.") from None

    def reap(self) -> int:
        removed = self.engine.remove_containers({LABEL_SPEC: self.spec_path})
        self.engine.remove_networks({LABEL_SPEC: self.spec_path})
        return removed

    def environment(self) -> str:
        """The image's ID (a rebuilt image under the same tag is another environment), and the
        variables passed in (names and values), by an HMAC under the user's key: notes are
        read by others, and a digest without a key would let them test guesses of a value."""
        if self._environment is None:
            passed = ""
            if self.env:
                passed = f" env:{userkey.load().digest('pass-env', self.env)}"
            self._environment = f"docker {self.engine.image_id(self.image)}{passed}"
        return self._environment


TIMED_OUT = 124  # the supervisor's exit code when it killed a command at its timeout


def _pump(stream: ExecStream, capture: OutputCapture,
          on_output: Callable[[bytes], None] | None = None) -> bool:
    """Read a command's output to its end; True if the deadline passed first."""
    try:
        while (frame := stream.frame()) is not None:
            capture.add(frame[1])
            if on_output is not None:
                on_output(frame[1])
    except DeadlineExceeded:
        return True
    return False


def helper_argv(*args: str) -> list[str]:
    """The in-container helper's command line (see PYTHONS)."""
    return ["/bin/sh", "-c", _LAUNCH, "retcon-helper", "-c", helper_source(), "--workspace",
            "/workspace", *args]


def proxy_variables(url: str) -> dict[str, str]:
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "NO_PROXY": PROXY_ALIAS, "no_proxy": PROXY_ALIAS}


def _ca_tar(bundle: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(CA_PATH.rsplit("/", 1)[0].lstrip("/"))
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        info = tarfile.TarInfo(CA_PATH.lstrip("/"))
        info.size, info.mode = len(bundle), 0o644
        tar.addfile(info, io.BytesIO(bundle))
    return buffer.getvalue()


def _quietly(action: Callable[[], object]) -> None:
    with contextlib.suppress(docker.errors.DockerException):
        action()


def _logs(container: Any) -> str:
    try:
        return bytes(container.logs(stdout=False, stderr=True, tail=200)).decode(
            "utf-8", "replace")
    except docker.errors.DockerException:
        return ""


def _wait_listening(proxy: Any) -> None:
    deadline = time.monotonic() + PROXY_READY_S
    while time.monotonic() < deadline:
        if "listening on" in _logs(proxy):
            return
        proxy.reload()
        if proxy.status not in ("created", "running"):
            break
        time.sleep(0.1)
    raise SandboxError("the setup's egress proxy did not start: " + _logs(proxy)[-500:],
                       "Rebuild it (`retcon-sandbox images build`); or give --setup-network "
                       "full.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
