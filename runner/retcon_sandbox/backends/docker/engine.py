"""The connection to the Docker engine: the one module that imports the docker SDK.

Every SDK call is a method here. A failure becomes one of our errors (ImageError, SandboxError,
or EngineError, which carries the engine's own words for the caller to put in context) or a
typed result; nothing outside this module sees a docker exception or a docker object.

The SDK (and requests, under it) is imported when first used, not with this module: a command
that never reaches an engine (a spec that fails validation, `--sandbox local`, `status`) starts
without the ~0.1–0.2 s that import costs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import ipaddress
import itertools
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

from retcon_sandbox import threads
from retcon_sandbox.backends.docker import endpoints
from retcon_sandbox.errors import ImageError, SandboxError, env_number
from retcon_sandbox.text import plain_number, sanitize_name


class _OnFirstUse(ModuleType):
    """A module imported when one of its attributes is first read."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self.__name__), name)


if TYPE_CHECKING:
    import docker
    import docker.errors
    import requests
else:
    docker = _OnFirstUse("docker")  # `docker.errors` is imported by the package itself
    requests = _OnFirstUse("requests")  # and `requests.exceptions` by its own

def prefetch() -> None:
    """Import the SDK (and requests) in a thread of its own while the caller goes on: a command
    that will need the engine spends its spec's and repository's checks, mostly waiting for
    git, importing it too (0.2 to 0.3 s of CPU), instead of after them. A failed import is
    left for the first use to raise."""
    threads.import_ahead("docker")


LABEL_RUN = "retcon-sandbox.run"
LABEL_SPEC = "retcon-sandbox.spec"


CONNECT_DEADLINE_S = 20.0


MAX_CONNECT_DEADLINE_S = 3600.0  # past an hour no engine is coming; past ~24 days sockets fail


def _connect_deadline() -> float:
    """Seconds the engine has to answer its first requests (RETCON_SANDBOX_ENGINE_TIMEOUT)."""
    return env_number("RETCON_SANDBOX_ENGINE_TIMEOUT", CONNECT_DEADLINE_S,
                      meaning="the seconds the engine has to answer",
                      maximum=MAX_CONNECT_DEADLINE_S)


def _bad_address(exc: ValueError, endpoint: endpoints.Endpoint) -> SandboxError:
    """The SDK cannot parse the engine's address (a port out of range, an unclosed IPv6
    bracket): name the setting that gave it, and its value."""
    if endpoint.source == "--engine":
        where = f"--engine {sanitize_name(endpoint.host)}"
    elif endpoint.source == "DOCKER_HOST":
        where = f"DOCKER_HOST={sanitize_name(endpoint.host)}"
    else:
        where = f"the host {sanitize_name(endpoint.host)} of the {endpoint.source}"
    return SandboxError(f"{where} is not a Docker engine address: {_first_line(exc)}",
                        "Give an address such as unix:///var/run/docker.sock, "
                        "tcp://HOST:2376 (a port from 1 to 65535; an IPv6 host in brackets, "
                        "tcp://[::1]:2376) or ssh://USER@HOST, or a docker context's name.")


def _no_engine(exc: BaseException, deadline: float, endpoint: endpoints.Endpoint) -> SandboxError:
    """The engine cannot be used: where we looked (DOCKER_HOST's value, or the context or
    default socket in use), and what to do."""
    given = endpoint.source == "--engine"
    if given:
        where = f"--engine {endpoint.host}"
    else:
        where = (f"DOCKER_HOST={endpoint.host}" if endpoint.source == "DOCKER_HOST"
                 else f"{endpoint.describe()} (DOCKER_HOST is not set)")
    setting = "--engine" if given else "DOCKER_HOST"
    remote = _remote_host(endpoint.host)
    if remote is not None:
        return _no_remote_engine(exc, where, remote, endpoint.host, setting)
    if isinstance(exc, requests.exceptions.Timeout) or "timed out" in str(exc).lower():
        return SandboxError(
            f"the Docker engine at {where} accepted the connection but did not answer within "
            f"{plain_number(deadline)} s", f"Check that {setting} names a Docker engine and "
            "that it is not stuck (`docker info` must answer), or raise "
            "RETCON_SANDBOX_ENGINE_TIMEOUT for a slow one.")
    if endpoint.host.startswith("ssh://"):
        return SandboxError(
            f"no Docker engine answers at {where}: {_first_line(exc)}",
            f"`docker -H {endpoint.host} info` must work without a prompt: the server's key "
            "must already be in ~/.ssh/known_hosts (an unknown host is never trusted; connect "
            "once with ssh to check and record it), and your key must be accepted.")
    return SandboxError(
        f"no Docker engine answers at {where}: {_first_line(exc)}",
        "Start the engine (`sudo systemctl start docker`, or `sudo dockerd &`), or "
        + ("give another --engine" if given else "set DOCKER_HOST")
        + "; `docker info` must work. Without Docker nothing untrusted can run.")


def _remote_host(host: str) -> str | None:
    """The host of an engine on another machine (tcp:// to anything but this one), else None."""
    if not host.startswith("tcp://"):
        return None
    try:
        name = urllib.parse.urlsplit(host).hostname or ""
    except ValueError:
        return None
    if not name or name.lower() == "localhost":
        return None
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name
    return None if address.is_loopback or address.is_unspecified else name


def _no_remote_engine(exc: BaseException, where: str, remote: str, host: str,
                      setting: str) -> SandboxError:
    """An engine on another machine: starting a local daemon would not help."""
    timed_out = isinstance(exc, requests.exceptions.Timeout) or "timed out" in str(exc).lower()
    connected = timed_out and not isinstance(exc, requests.exceptions.ConnectTimeout)
    what = ("accepted the connection but did not answer in time" if connected
            else "cannot be reached")
    return SandboxError(
        f"the remote Docker engine at {where} {what}: {_first_line(exc)}",
        f"It runs on another machine ({sanitize_name(remote)}): check that its engine is up "
        "and listening there, and that this machine reaches it (network, firewall, port; "
        f"DOCKER_TLS_VERIFY and DOCKER_CERT_PATH for TLS). `docker -H {sanitize_name(host)} "
        f"info` must work; or give another {setting}.")


@functools.cache
def engine_errors() -> tuple[type[BaseException], ...]:
    """What an SDK call can raise besides the SDK's own errors: requests' (a connection lost or
    timed out mid-run) and, for ssh:// engines, paramiko's (an optional dependency, so looked
    up, and only when an error is being handled: `except engine_errors()` evaluates then)."""
    found: tuple[type[BaseException], ...] = (
        docker.errors.DockerException, requests.exceptions.RequestException)
    try:
        paramiko = importlib.import_module("paramiko")
    except ImportError:
        return found
    return (*found, paramiko.SSHException)


GONE_S = 30.0  # how long `_remove` waits for a removal someone else is doing already
SSH_POOL = 3  # idle API connections kept over SSH, each one of the server's sessions


def _pool_size(host: str) -> int:
    """The SDK keeps up to 10 idle API connections. Over SSH each is a session of the one
    connection, and sshd allows 10 (MaxSessions): the attached streams of the sandboxes and
    their commands need the rest, or a command's stream is refused mid-run."""
    return SSH_POOL if host.startswith("ssh://") else 10


def _connect_errors() -> tuple[type[BaseException], ...]:
    """What connecting can raise: what any call can, and the socket's own errors."""
    return (*engine_errors(), OSError)


class EngineError(SandboxError):
    """An SDK call failed; the message is the first line of what the engine said."""


class DockerEngine:
    """A connection to the engine at `endpoint` (default: DOCKER_HOST, the docker context, or
    the default socket)."""

    def __init__(self, endpoint: endpoints.Endpoint | None = None) -> None:
        self.endpoint = endpoints.select() if endpoint is None else endpoint
        deadline = _connect_deadline()
        try:
            with threads.quiet():  # paramiko's transport thread (ssh://) leaves Ctrl-C to us
                self.client = self._client(deadline)
                version = self.client.version()  # an answer: no ping needed before it
            endpoints.refuse_unsupported(self.endpoint, version)
        except _connect_errors() as exc:
            raise _no_engine(exc, deadline, self.endpoint) from None
        self.client.api.timeout = 120

    def _client(self, deadline: float) -> docker.DockerClient:
        """The SDK's client for the endpoint (nothing is sent yet)."""
        try:
            return docker.from_env(timeout=deadline,  # type: ignore[arg-type]
                                   environment=self.endpoint.environment,
                                   max_pool_size=_pool_size(self.endpoint.host))
        except ValueError as exc:  # urllib's parse of the address
            raise _bad_address(exc, self.endpoint) from None

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
        except engine_errors():
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
        except engine_errors() as exc:
            raise ImageError(f"building {tag} failed: {_first_line(exc)}") from None

    def image_tags(self, prefix: str) -> list[str]:
        """Every local image tag starting with `prefix`."""
        try:
            found = self.client.images.list()
        except engine_errors() as exc:
            raise ImageError(f"cannot list images: {_first_line(exc)}") from None
        return sorted(t for image in found for t in image.tags if t.startswith(prefix))

    def remove_image(self, tag: str) -> None:
        try:
            self.client.images.remove(tag)
        except docker.errors.ImageNotFound:
            pass
        except engine_errors() as exc:
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
        except engine_errors() as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None

    def is_running(self, container_id: str) -> bool:
        try:
            return bool(self.client.containers.get(container_id).attrs["State"]["Running"])
        except engine_errors():
            return False

    def _image_config(self, name: str) -> dict[str, Any] | None:
        """An image's configuration (labels, volumes, ENV); None when there is no such image."""
        try:
            return self.client.images.get(name).attrs.get("Config") or {}
        except docker.errors.ImageNotFound:
            return None
        except engine_errors() as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None

    def image_labels(self, name: str) -> dict[str, str]:
        config = self._image_config(name) or {}
        return {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}

    def image_volumes(self, name: str) -> list[str]:
        """The paths an image declares as VOLUMEs."""
        config = self._image_config(name) or {}
        return sorted((config.get("Volumes") or {}).keys())

    def image_env(self, name: str) -> dict[str, str]:
        """The variables an image's configuration sets (ENV)."""
        config = self._image_config(name) or {}
        pairs = (str(item).partition("=") for item in config.get("Env") or [])
        return {name: value for name, _, value in pairs}

    def import_rootfs(self, stream: IO[bytes], repository: str, tag: str) -> None:
        try:
            self.client.api.import_image_from_stream(stream, repository=repository, tag=tag)
        except engine_errors() as exc:
            raise ImageError(f"importing the root filesystem failed: {_first_line(exc)}") from None

    def sandbox_networks(self, labels: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        """The setup networks on the engine (those of runs on one spec, with `labels`)."""
        selector = [f"{k}={v}" for k, v in labels.items()] if labels else [LABEL_RUN]
        try:
            found = self.client.networks.list(filters={"label": selector})
        except engine_errors() as exc:
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
        except engine_errors() as exc:
            raise SandboxError(f"cannot list containers: {_first_line(exc)}") from None
        return {str(c.id): dict(c.labels or {}) for c in found}

    def remove_container(self, container_id: str) -> None:
        try:
            _remove(self.client.containers.get(container_id))
        except docker.errors.NotFound:
            pass
        except engine_errors() as exc:
            raise SandboxError(f"cannot remove container {container_id[:12]}: "
                               f"{_first_line(exc)}") from None

    def count_containers(self, label: str) -> int:
        return len(self.client.containers.list(all=True, ignore_removed=True,
                                               filters={"label": label}))

    # -- one run's containers, networks and execs (callers put an EngineError in context) --

    def create_container(self, kwargs: dict[str, Any]) -> str:
        """A created (not started) container from `kwargs` (the SDK's create arguments; a
        `log_config` is a plain dict): its id."""
        image = str(kwargs["image"])
        try:
            return str(self.client.containers.create(**kwargs).id)
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {image} is not available",
                             "Run `retcon-sandbox images build`, or name another image with "
                             "--image.") from None
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def attach_stdin(self, container_id: str) -> Any:
        """A socket whose writes are the container's standard input: the wrapper the SDK
        returns, which must be kept (collected, it closes the socket under its user). A
        container created with stdin_open and detach=False (StdinOnce) sees its input end when
        this connection closes, whoever closes it: the kernel does when our process dies."""
        try:
            return self.client.api.attach_socket(container_id, params={"stdin": 1, "stream": 1})
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def put_archive(self, container_id: str, path: str, data: bytes) -> None:
        """Unpack the tar `data` at `path` in the container (done by the engine)."""
        try:
            self.client.containers.get(container_id).put_archive(path, data)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def start_container(self, container_id: str) -> None:
        try:
            self.client.containers.get(container_id).start()
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def container_status(self, container_id: str) -> str:
        """The container's state as of now (created, running, exited, ...)."""
        try:
            return str(self.client.containers.get(container_id).status)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def container_logs(self, container_id: str, tail: int = 200) -> str:
        """The last `tail` lines the container wrote on stderr; "" if they cannot be read."""
        try:
            container = self.client.containers.get(container_id)
            return bytes(container.logs(stdout=False, stderr=True, tail=tail)).decode(
                "utf-8", "replace")
        except engine_errors():
            return ""

    def discard_container(self, container_id: str) -> None:
        """Remove the container (and its anonymous volumes), whatever the engine answers, and
        return once it is gone (see `_remove`)."""
        try:
            _remove(self.client.containers.get(container_id))
        except engine_errors():
            pass

    def commit_container(self, container_id: str, labels: dict[str, str]) -> str:
        """The container as an untagged image (its tmpfs mounts are not part of it): its ID."""
        try:
            container = self.client.containers.get(container_id)
            return str(container.commit(conf={"Labels": labels}).id)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def layer_size(self, image_id: str) -> int:
        """The size of the image's own (top) layer, in bytes: what a committed container wrote.
        The engine keeps it with the layer; a container's SizeRw is computed by walking its
        whole file system (seconds on fuse-overlayfs)."""
        try:
            layers = self.client.images.get(image_id).history()
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None
        return int(layers[0].get("Size") or 0) if layers else 0

    def changes(self, container_id: str) -> int:
        """How many paths the container added, changed or deleted in its own layer (its tmpfs
        mounts aside): the engine lists what is in the layer, without walking the image."""
        try:
            return len(self.client.api.diff(container_id) or [])
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def save_images(self, names: list[str]) -> Iterator[bytes]:
        """`docker save` of `names` as one archive (layers they share once), in chunks: the
        Engine API's multi-image form, which the SDK's `get_image` (one image) lacks."""
        try:
            api: Any = self.client.api
            response = api._get(api._url("/images/get"), params={"names": names},
                                stream=True)
            api._raise_for_status(response)
            yield from response.iter_content(1 << 20)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def load_images(self, archive: IO[bytes]) -> None:
        """`docker load` of an archive read from `archive` (streamed, never held whole)."""
        try:
            api: Any = self.client.api  # the SDK's load_image is untyped
            for line in api.load_image(archive):
                if isinstance(line, dict) and line.get("error"):
                    raise EngineError(str(line["error"]))
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def tag_image(self, image_id: str, repository: str, tag: str) -> None:
        try:
            if not self.client.api.tag(image_id, repository, tag):
                raise EngineError(f"the engine did not tag {image_id[:19]}")
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def create_network(self, name: str, labels: dict[str, str], **options: Any) -> str:
        """A bridge network named `name` (`options`: the SDK's, e.g. internal=True): its id."""
        try:
            network = self.client.networks.create(name, driver="bridge", labels=labels,
                                                  **options)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None
        return str(network.id)

    def connect(self, network_id: str, container_id: str, aliases: list[str]) -> None:
        """Attach the container to the network, reachable there under `aliases`."""
        try:
            self.client.networks.get(network_id).connect(container_id, aliases=aliases)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def exec_open(self, container_id: str, argv: list[str], user: str, *, stdin: bool,
                  environment: dict[str, str] | None = None) -> tuple[str, Any]:
        """Start `argv` in the container, in /workspace, as `user`: the exec's id and its
        attach socket (stdout and stderr multiplexed; stdin if asked for)."""
        api = self.client.api
        try:
            exec_id = api.exec_create(container_id, argv, stdin=stdin, stdout=True,
                                      stderr=True, user=user, workdir="/workspace",
                                      environment=environment)["Id"]
            return str(exec_id), api.exec_start(exec_id, socket=True)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None

    def exec_run(self, container_id: str, argv: list[str], user: str) -> tuple[int, bytes]:
        """Run `argv` in the container as `user` and wait for it to end: its exit code (-1 when
        the engine does not say) and what it wrote on stdout."""
        api = self.client.api
        try:
            exec_id = api.exec_create(container_id, argv, user=user, stdout=True,
                                      stderr=False)["Id"]
            output = api.exec_start(exec_id)
            code = api.exec_inspect(exec_id).get("ExitCode")
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None
        return (-1 if code is None else int(code)), bytes(output or b"")

    def exec_exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code; None while it runs. The engine cannot say: EngineError (a
        command's result is never made up from a failed request)."""
        try:
            info = self.client.api.exec_inspect(exec_id)
        except engine_errors() as exc:
            raise EngineError(_first_line(exc)) from None
        code = info.get("ExitCode")
        return None if info.get("Running") or code is None else int(code)

    # -- what the engine has, and what an image really is (spec images, environments) ------

    def resources(self) -> tuple[int, int]:
        """The engine's memory (MemTotal, bytes) and CPUs (NCPU); 0 when it does not say."""
        try:
            info = self.client.info()
        except engine_errors() as exc:
            raise SandboxError(f"cannot ask the engine what it has: {_first_line(exc)}") from None
        return int(info.get("MemTotal") or 0), int(info.get("NCPU") or 0)

    def image_record(self, name: str) -> ImageRecord:
        """What `name` resolves to: its ID, its tags (RepoTags), labels and creation time. A
        short name the engine takes as an ID prefix has none of its tags equal to it."""
        try:
            attrs = self.client.images.get(name).attrs
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {name} is not available",
                             "Run `retcon-sandbox images build`, or name another image with "
                             "--image.") from None
        except engine_errors() as exc:
            raise ImageError(f"cannot inspect image {name}: {_first_line(exc)}") from None
        return _record(attrs, (attrs.get("Config") or {}).get("Labels"))

    def images_labelled(self, label: str, value: str | None = None) -> list[ImageRecord]:
        """Every image whose `label` is `value` (with None: that has `label`)."""
        try:
            found = self.client.api.images(
                filters={"label": label if value is None else f"{label}={value}"})
        except engine_errors() as exc:
            raise ImageError(f"cannot list images: {_first_line(exc)}") from None
        return [_record(i, i.get("Labels")) for i in found]

    def untagged_images(self, label: str) -> dict[str, dict[str, str]]:
        """Every image with `label` (any value) and no tag, by ID, with its labels."""
        try:
            found = self.client.api.images(filters={"label": label, "dangling": True})
        except engine_errors() as exc:
            raise ImageError(f"cannot list images: {_first_line(exc)}") from None
        return {str(i["Id"]): dict(i.get("Labels") or {}) for i in found}

    # -- volumes (setup's package caches) ---------------------------------------------------

    def has_volume(self, name: str) -> bool:
        try:
            self.client.volumes.get(name)
        except docker.errors.NotFound:
            return False
        except engine_errors() as exc:
            raise EngineError(f"cannot inspect volume {name}: {_first_line(exc)}") from None
        return True

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        try:
            self.client.volumes.create(name=name, labels=labels)
        except engine_errors() as exc:
            raise EngineError(f"cannot create volume {name}: {_first_line(exc)}") from None

    def volumes_labelled(self, label: str, value: str | None = None) -> dict[str, dict[str, str]]:
        """Every volume carrying `label` (equal to `value` if given): name -> labels."""
        wanted = label if value is None else f"{label}={value}"
        try:
            found = self.client.volumes.list(filters={"label": wanted})
        except engine_errors() as exc:
            raise EngineError(f"cannot list volumes: {_first_line(exc)}") from None
        return {str(v.name): dict(v.attrs.get("Labels") or {}) for v in found}

    def remove_volume(self, name: str) -> bool:
        """Remove a volume; False when a container still uses it (it is kept)."""
        try:
            self.client.volumes.get(name).remove()
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return False
            raise EngineError(f"cannot remove volume {name}: {_first_line(exc)}") from None
        except engine_errors() as exc:
            raise EngineError(f"cannot remove volume {name}: {_first_line(exc)}") from None
        return True

    def host_addresses(self) -> list[str]:
        """The engine host's own addresses as a container may reach them: every network's
        gateway, and, when the engine is on this machine (a unix socket), this machine's
        interface addresses."""
        found: set[str] = set()
        try:
            for network in self.client.api.networks():
                for config in (network.get("IPAM") or {}).get("Config") or ():
                    if config.get("Gateway"):
                        found.add(str(config["Gateway"]).split("/")[0])
        except engine_errors():
            pass
        if str(self.client.api.base_url).startswith("http+docker://local"):
            found.update(local_addresses())
        return sorted(found)


@dataclass(frozen=True)
class ImageRecord:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    created: str  # RFC 3339 from inspect, or seconds since the epoch from a listing


def _record(attrs: dict[str, Any], labels: dict[str, Any] | None) -> ImageRecord:
    """An image as inspect or a listing describes it (their labels sit in different places)."""
    return ImageRecord(str(attrs.get("Id", "")), tuple(attrs.get("RepoTags") or ()),
                       {str(k): str(v) for k, v in (labels or {}).items()},
                       str(attrs.get("Created", "")))


def local_addresses() -> set[str]:
    """This machine's interface addresses (Linux /proc), IPv4 and IPv6."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in itertools.pairwise(lines):
            if line.strip() == "/32 host LOCAL":
                found.add(previous.split()[-1])
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(str(ipaddress.IPv6Address(int(raw, 16))))
    return found


def _remove(container: Any) -> None:
    """Remove a container with its volumes, and return once it is gone. One already gone counts
    as removed. One being removed by someone else is waited for, up to GONE_S: the engine
    itself once its keeper has ended (auto-remove), a concurrent `clean`, the run that owns
    it. That removal refuses a second one (409) and takes seconds on a busy engine, while the
    container is still there for anyone who looks (a run that says it removed its containers,
    `clean`, a test)."""
    try:
        container.remove(force=True, v=True)
        return
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code != 409 or "already in progress" not in str(exc):
            raise
    deadline = time.monotonic() + GONE_S
    while time.monotonic() < deadline:
        try:
            container.reload()
        except docker.errors.NotFound:
            return
        time.sleep(0.1)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def engine_version(timeout: int = 3) -> str:
    """The engine's version, for a crash log: never more than about `timeout` seconds, and
    never an exception (what went wrong is the answer instead)."""
    try:
        client = docker.from_env(timeout=timeout)
        try:
            info = client.version()
        finally:
            client.close()
    except Exception as exc:  # any failure is the answer: this is a diagnostic
        return f"not reachable ({_first_line(exc)})"
    return f"{info.get('Version', '?')} (API {info.get('ApiVersion', '?')}, {info.get('Os', '?')}" \
           f"/{info.get('Arch', '?')})"
