"""The Docker backend: per-run sandboxes, the setup container and its egress proxy.

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
import re
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retcon_sandbox import deadlines, userkey
from retcon_sandbox.backends.api import (
    COMMAND_MARGIN_S,
    CommandResult,
    DeadlineExceeded,
    HelperSandbox,
    ToolFailure,
    check_isolation,
)
from retcon_sandbox.backends.docker import liveness
from retcon_sandbox.backends.docker.engine import LABEL_RUN, LABEL_SPEC, DockerEngine, EngineError
from retcon_sandbox.backends.docker.leases import LEASE_S, Leases
from retcon_sandbox.backends.docker.stream import ExecStream, ExecTransport
from retcon_sandbox.backends.hostaccess import CACHE_PATH, IMMUTABLE
from retcon_sandbox.errors import ImageError, SandboxError
from retcon_sandbox.protocol import OutputCapture
from retcon_sandbox.resources import (
    egress_source,
    helper_source,
    keeper_source,
    supervisor_source,
)
from retcon_sandbox.spec.settings import SandboxSettings, human_bytes

UID = 10001  # the helper: file tools
COMMAND_UID = 10002  # builds and tests: cannot signal, trace or read the helper
GID = 10000  # shared by both, on /workspace (setgid, group-writable)
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
# Every container's first process (sandbox/keeper.py): it ends the container when its run is
# gone. An image without python3 runs `sleep` for the lease instead (the helper then says what
# is missing, and the run removes the container).
_KEEP = (f"for p in {' '.join(PYTHONS)}; do if [ -x \"$p\" ]; then exec \"$p\" -I -S \"$@\"; "
         f"fi; done; exec sleep {LEASE_S:.0f}")
# Setup's package cache (a volume at CACHE_PATH, mounted into setup containers only): where
# each tool keeps its downloads. Cargo's downloads must be in the image for offline builds:
# they are copied in before setup and back after it (see Environments).
CACHE_MEASURE_S = 300  # the longest the package cache's measure may take (else: removed)
CACHE_VARIABLES = {"PIP_CACHE_DIR": f"{CACHE_PATH}/pip", "UV_CACHE_DIR": f"{CACHE_PATH}/uv",
                   "UV_LINK_MODE": "copy", "npm_config_cache": f"{CACHE_PATH}/npm"}
# Setup's embedded DNS forwards to an address that leads nowhere: names are resolved by the
# egress proxy alone (older engines forwarded internal networks' queries, CVE-2024-29018).
NO_DNS = "192.0.2.1"
# In the container's own network namespace: a closed socket leaves no TIME_WAIT entry (which
# keeps its port bound for a minute with no process left) and no cached metrics, so nothing of
# one tree's connections reaches a later tree in a reused sandbox.
SYSCTLS = {"net.ipv4.tcp_max_tw_buckets": "0", "net.ipv4.tcp_no_metrics_save": "1"}


class DockerSandbox(HelperSandbox):
    """File tools through the helper; each command in a `docker exec` of its own, under the
    commands' uid, read and capped by the host (see `DockerSandboxes.run_command`)."""

    def __init__(self, transport: ExecTransport, backend: DockerSandboxes, container_id: str,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(transport, backend.env if env is None else env)
        self._backend = backend
        self.container_id = container_id
        self._prepare_first: PrepareFirst | None = None  # see `prepare_with_next_command`

    def run(self, command: str, timeout: float,
            on_output: Callable[[bytes], None] | None = None) -> CommandResult:
        first, self._prepare_first = self._prepare_first, None
        result = self._backend.run_command(self.container_id, command, timeout, self._env,
                                           on_output, prepare_first=first)
        if result.exit_code >= 126 or result.exit_code < 0:
            self._still_alive(command)
        return result

    def prepare_workspace(self, git: bool, tag: str | None, distance: int = 0,
                          listing: bytes = b"") -> CommandResult:
        """The git metadata (a repository whose last commit holds the tree `listing` gives:
        its `update-index -z --index-info` records; `distance` commits after the tag `tag`),
        then what a setup left in the workspace: as the commands' uid, which then owns them.
        Made again, it replaces the git metadata made before."""
        return self._backend.run_command(self.container_id, "prepare the workspace",
                                         PREPARE_S, self._env,
                                         mode_args=_prepare_args(git, tag, distance, listing),
                                         feed=listing if git and listing else None)

    def prepare_with_next_command(self, git: bool, tag: str | None, distance: int = 0,
                                  failed: Callable[[int, str], None] | None = None,
                                  listing: bytes = b"") -> None:
        """`prepare_workspace`, in the exec of the next command (`run`), just before it: one
        exec less, for a sandbox whose files nothing reads before its first command, or whose
        files changed in place since it was prepared. When it fails, that command's output
        says so first, `failed(exit code, why)` is called, and the command runs all the same.
        Its time is not the command's. A second call before that command replaces the
        first."""
        self._prepare_first = PrepareFirst(_prepare_args(git, tag, distance, listing), failed,
                                           listing if git and listing else None)

    def snapshot(self) -> CommandResult:
        """As the helper's uid: only it reads the tree list (setup's commands cannot change
        which of the workspace's files count as the tree's)."""
        return self._backend.run_command(self.container_id, "keep what setup made",
                                         COMMAND_MARGIN_S * 20, self._env,
                                         mode_args=["--snapshot"], uid=UID)

    def wipe(self) -> list[str]:
        """Make this used sandbox ready for another tree: the supervisor's `--wipe` as the
        commands' uid (every process of it killed, what it may remove of the scratch file
        systems removed), then the helper's `reset`. What is left that differs from the sandbox
        as it started: none when it is as new."""
        wiped = self._backend.run_command(self.container_id, "wipe the sandbox",
                                          COMMAND_MARGIN_S * 4, self._env, mode_args=["--wipe"])
        if not wiped.passed:
            return [f"the wipe exited {wiped.exit_code}: {wiped.output.strip()[-200:]}"]
        return self.reset()

    def clock(self, timeout: float) -> str | None:
        """The container's clock, `seconds.nanoseconds` (the host's may differ: a remote
        engine), for `owned_files`; None when the image's `date` cannot say it."""
        result = self._run_system(CLOCK, timeout)
        text = result.output.strip()
        return text if result.passed and SECONDS.fullmatch(text) else None

    def owned_files(self, since: str, timeout: float) -> int | None:
        """How many files, folders and links outside the tmpfs mounts that belong to the
        commands' uid or group were made or changed after `since` (a `clock` reading): setup
        runs as that uid without capabilities, so everything it makes is theirs, and the
        inode's change time is set by the kernel, never by them (see
        `Preparer._within_files`). None when that cannot be told: a folder of theirs the uid
        cannot read, an image without GNU find (the engine's own count is asked then)."""
        if not SECONDS.fullmatch(since):
            return None
        result = self._run_system(owned_files_command(since), timeout)
        text = result.output.strip()
        if not result.passed or not (text.isascii() and text.isdigit()):
            return None
        return int(text)

    def _run_system(self, command: str, timeout: float) -> CommandResult:
        """`command` as the commands' uid, with no library the image's ENV would preload
        (SYSTEM_ENV); the command sets SYSTEM_PATH itself."""
        return self._backend.run_command(self.container_id, command, timeout,
                                         {**self._env, **SYSTEM_ENV})

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


class DockerSandboxes:
    """The containers of a run: its sandboxes, setup's container and its egress proxy.
    `DockerBackend` (`backend.py`) adds the prepared environments."""

    name = "docker"

    def __init__(self, engine: DockerEngine, image: str, settings: SandboxSettings,
                 env: dict[str, str], spec_path: Path, proxy_image: str | None = None) -> None:
        """`proxy_image`: our own base image, which setup's egress proxy and the package
        cache's root containers run from (never the run's image, which a spec names)."""
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
        self.authority_failed: str | None = None  # why the last setup's proxy has no CA
        self.sysctls = dict(SYSCTLS)  # emptied when the engine cannot set them (`_started`)
        self.leases = Leases(engine)  # each container's input, held while the run lives

    def engine_name(self) -> str:
        return self.engine.endpoint.describe()

    def describe(self) -> str:
        s = self.settings
        return (f"docker (image {self.image}, network none, uids {UID}/{COMMAND_UID}, memory "
                f"{human_bytes(s.memory)}, pids {s.pids})")

    def create_kwargs(self, label: str, image: str | None = None, lifetime: float = 0.0
                      ) -> dict[str, Any]:
        """A container that ends itself when its run is gone (see `keeper_kwargs`), or
        `lifetime` seconds after it started (0: no such bound)."""
        s = self.settings
        return {
            "image": image or self.image,
            **keeper_kwargs(lifetime),  # the image's ENTRYPOINT never runs
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
            "sysctls": dict(self.sysctls),
            "environment": {"HOME": "/tmp"},  # --pass-env reaches each command's exec only
            "working_dir": "/workspace",
            "labels": {LABEL_RUN: self.run_id, LABEL_SPEC: self.spec_path,
                       "retcon-sandbox.step": label, **self.owner},
            "stop_signal": "SIGKILL",
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
                   ca_bundle: bytes | None, cache: str | None = None, lifetime: float = 0.0,
                   allowed: tuple[str, ...] = ()) -> Iterator[DockerSandbox]:
        """A sandbox for `[sandbox] setup`: hardened like any other, but its root is writable
        (it becomes the prepared image) and it has the network `network` names: `registries`
        (an internal network whose only way out is the egress proxy), `full` or `none`. The
        variables naming the proxy and the host's CA bundle reach the setup's commands only;
        the bundle's file (public certificates) stays in the image at CA_PATH. `cache`: the
        package cache's volume, mounted at CACHE_PATH (never part of the image). `lifetime`:
        the setup's own deadline, past which its container and proxy end themselves.
        `allowed`: --setup-allow-address's networks, which the egress proxy may reach.
        With a cache and a bundle, the proxy answers for IMMUTABLE's hosts itself, so that
        their files reach the cache (`sandbox/egress.py`): the bundle setup trusts then holds
        the proxy's CA too (`authority_failed` says why not, when it could not be made)."""
        with contextlib.ExitStack() as stack:
            kwargs = {**self.create_kwargs(label, lifetime=lifetime), "read_only": False}
            env = dict(self.env)
            if cache is not None:
                kwargs["volumes"] = {cache: {"bind": CACHE_PATH, "mode": "rw"}}
                env.update(CACHE_VARIABLES)
            self.authority_failed = None
            if network == "registries":
                kwargs.pop("network_mode")
                kwargs["network"], proxy, ours = stack.enter_context(self._egress(
                    registries, lifetime, allowed, ca_bundle if cache is not None else None))
                kwargs["dns"] = [NO_DNS]
                env.update(proxy_variables(proxy))
                ca_bundle = ca_bundle + ours if ca_bundle is not None and ours else ca_bundle
            elif network == "full":
                kwargs["network_mode"] = "bridge"
            if ca_bundle is not None:
                env.update(dict.fromkeys(CA_VARIABLES, CA_PATH))
            box = stack.enter_context(self._sandbox(kwargs, env, ca_bundle,
                                                    network_allowed=network != "none"))
            yield box

    def ensure_cache(self, name: str, labels: dict[str, str]) -> None:
        """The package cache's volume, made if missing and given to the commands' uid by a
        short container (`_on_cache`) with CHOWN only, which runs nothing but `chown` (the
        engine makes a new volume's root root's)."""
        if self.engine.has_volume(name):
            return
        self.engine.create_volume(name, labels)
        try:
            with self._on_cache(name, "CHOWN", "rw") as container_id:
                code, _ = self.engine.exec_run(container_id, ["chown", f"{COMMAND_UID}:{GID}",
                                                              CACHE_PATH], "0:0")
            if code != 0:
                raise EngineError(f"chown exited {code}")
        except SandboxError as exc:
            self.engine.remove_volume(name)  # never left unprepared
            raise SandboxError(f"cannot prepare the package cache {name}: {exc}",
                               "Give --no-package-cache to set up without it.") from None

    def cache_usage(self, name: str) -> tuple[int, int] | None:
        """The disk the package cache's volume uses, in bytes, and its files, as `du` counts
        them (each hard link in full: a copy out of the cache would not keep them) in a short
        container (`_on_cache`, the volume read-only) whose root may read every directory
        (DAC_OVERRIDE: not DAC_READ_SEARCH, which would open `open_by_handle_at` to the host's
        file systems). What setup wrote there cannot hide from it by its modes. None when it
        cannot be measured within CACHE_MEASURE_S seconds."""
        script = (f"timeout {CACHE_MEASURE_S} du -s -x -l -B1 {CACHE_PATH} && "
                  f"timeout {CACHE_MEASURE_S} du -s -x -l --inodes {CACHE_PATH}")
        try:
            with self._on_cache(name, "DAC_OVERRIDE", "ro") as container_id:
                code, output = self.engine.exec_run(container_id, ["/bin/sh", "-c", script],
                                                    "0:0")
        except SandboxError:  # the engine failed, or our base image is gone
            return None
        counts = [line.split(b"\t", 1)[0].strip() for line in output.splitlines()]
        if code != 0 or len(counts) != 2 or not all(c.isdigit() for c in counts):
            return None
        return int(counts[0]), int(counts[1])

    @contextlib.contextmanager
    def _on_cache(self, name: str, capability: str, mode: str) -> Iterator[str]:
        """A started container of our own base image with the volume `name` at CACHE_PATH
        (`mode` rw or ro), as root with the one `capability` and no network, running nothing
        but the execs it is given: its id. Removed at the end (SandboxError when it fails)."""
        if self.proxy_image is None:
            raise ImageError("the package cache's containers run from retcon-sandbox/base, which "
                             "was not made ready", "Give --no-package-cache, or report this.")
        kwargs = {**self.create_kwargs("cache", self.proxy_image, CACHE_MEASURE_S * 3),
                  "user": "0:0", "cap_add": [capability],
                  "volumes": {name: {"bind": CACHE_PATH, "mode": mode}}}
        kwargs["tmpfs"] = {k: v for k, v in kwargs["tmpfs"].items() if k in ("/tmp",
                                                                           "/workspace")}
        container_id = self._started(kwargs, None)
        try:
            yield container_id
        finally:
            self.discard(container_id)

    def commit_image(self, box: DockerSandbox, labels: dict[str, str]) -> str:
        """The setup container as an untagged image (its tmpfs mounts are not part of it): its
        ID, for `written` and `keep_image` (or `engine.remove_image`)."""
        try:
            return self.engine.commit_container(box.container_id, labels)
        except EngineError as exc:
            raise SandboxError(f"cannot keep the prepared environment: {exc}") from None

    def files_written(self, box: DockerSandbox) -> int:
        """How many files, folders and links setup made or changed outside its tmpfs mounts."""
        try:
            return self.engine.changes(box.container_id)
        except EngineError as exc:
            raise SandboxError(f"cannot measure the prepared environment: {exc}") from None

    def written(self, image_id: str) -> int:
        """What the setup wrote: the committed image's own layer, in bytes."""
        try:
            return self.engine.layer_size(image_id)
        except EngineError as exc:
            raise SandboxError(f"cannot measure the prepared environment: {exc}") from None

    def keep_image(self, image_id: str, repository: str, tag: str) -> None:
        try:
            self.engine.tag_image(image_id, repository, tag)
        except EngineError as exc:
            raise SandboxError(f"cannot keep the prepared environment as {repository}:{tag}: "
                               f"{exc}") from None

    @contextlib.contextmanager
    def _sandbox(self, kwargs: dict[str, Any], env: dict[str, str] | None = None,
                 ca_bundle: bytes | None = None, network_allowed: bool = False
                 ) -> Iterator[DockerSandbox]:
        image = str(kwargs["image"])
        container_id = self._started(kwargs, ca_bundle)
        box: DockerSandbox | None = None
        try:
            box = self._start_helper(container_id, image, env, network_allowed)
            yield box
        except EngineError as exc:
            raise SandboxError(f"the sandbox container failed: {exc}") from None
        finally:
            if box is not None:
                box.close()
            self.discard(container_id)

    def _started(self, kwargs: dict[str, Any], ca_bundle: bytes | None) -> str:
        """A container created (with the CA bundle, when given) and started: its id. An engine
        that cannot set SYSCTLS (a kernel where they are not per network namespace, a runtime
        such as gVisor) gets it again without them, and so do later sandboxes: a reused
        sandbox's check counts the sockets anyway, so one that kept some is not reused."""
        container_id = None
        try:
            container_id = self.engine.create_container(kwargs)
            self.leases.hold(container_id)
            if ca_bundle is not None:
                self.engine.put_archive(container_id, "/", _ca_tar(ca_bundle))
            self.engine.start_container(container_id)
            return container_id
        except EngineError as exc:
            if container_id is not None:
                self.discard(container_id)
            said = str(exc).lower()  # runc: "open /proc/sys/net/...: no such file"
            if kwargs.get("sysctls") and ("sysctl" in said or "/proc/sys/" in said):
                self.sysctls = {}
                return self._started({**kwargs, "sysctls": {}}, ca_bundle)
            what = "cannot create a sandbox container" if container_id is None else \
                "the sandbox container failed"
            raise SandboxError(f"{what}: {exc}") from None

    def discard(self, container_id: str) -> None:
        """End the container (its input closed: its keeper ends it) and remove it now."""
        self.leases.release(container_id)
        self.engine.discard_container(container_id)

    @contextlib.contextmanager
    def _egress(self, registries: tuple[str, ...], lifetime: float = 0.0,
                allowed: tuple[str, ...] = (), bundle: bytes | None = None
                ) -> Iterator[tuple[str, str, bytes]]:
        """An internal network whose only way out is the egress proxy (`sandbox/egress.py`),
        itself on an ordinary network: (the internal network's name, the proxy's URL, its CA's
        certificate or b""). The internal network's bridge has no address on the host
        (`inhibit_ipv4`), so nothing listening on the host is reachable from it. The proxy
        runs from our own base image, never the run's (which a spec names, and which setup
        may have changed). With `bundle` (the host's CA bundle), the proxy makes a CA for
        IMMUTABLE's hosts among `registries` (`_authority`)."""
        engine = self.engine
        image = self.proxy_image
        if image is None or not self.engine.has_image(image):
            raise ImageError("setup's egress proxy runs from retcon-sandbox/base, which is not "
                             "built", "Run `retcon-sandbox images build base`, or give "
                             "--setup-network full (or none).")
        labels = {LABEL_RUN: self.run_id, LABEL_SPEC: self.spec_path, **self.owner}
        suffix = uuid.uuid4().hex[:10]
        immutable = [h for h in registries if h in IMMUTABLE] if bundle is not None else []
        with contextlib.ExitStack() as stack:
            try:
                outside = f"retcon-egress-{suffix}"
                outside_id = engine.create_network(outside, labels)
                stack.callback(engine.remove_network, outside_id)
                inside = f"retcon-setup-{suffix}"
                inside_id = engine.create_network(
                    inside, labels, internal=True, enable_ipv6=False,
                    options={"com.docker.network.bridge.inhibit_ipv4": "true"})
                stack.callback(engine.remove_network, inside_id)
                proxy = engine.create_container(dict(
                    image=image, entrypoint=["/usr/bin/python3"],  # our base's
                    command=["-I", "-S", "-c", keeper_source(), str(LEASE_S), str(lifetime),
                             "/usr/bin/python3", "-I", "-S", "-c", egress_source(),
                             str(PROXY_PORT), *registries, *(f"--allow={a}" for a in allowed),
                             *(f"--immutable={h}:{IMMUTABLE[h]}" for h in immutable),
                             *(f"--block={a}" for a in engine.host_addresses())],
                    stdin_open=True, detach=False, auto_remove=True,
                    user=f"{UID}:{GID}", network=outside, cap_drop=["ALL"],
                    security_opt=["no-new-privileges"], read_only=True,
                    tmpfs={"/tmp": "rw,nosuid,nodev,size=16m"}, pids_limit=64,
                    mem_limit=256 * 1024 * 1024, nano_cpus=500_000_000, init=True,
                    environment={}, log_config=dict(
                        type="json-file", config={"max-size": "1m", "max-file": "1"}),
                    labels={**labels, "retcon-sandbox.step": "egress proxy"}))
                stack.callback(self.discard, proxy)
                self.leases.hold(proxy)
                engine.connect(inside_id, proxy, aliases=[PROXY_ALIAS])
                engine.start_container(proxy)
                _wait_listening(engine, proxy)
            except EngineError as exc:
                raise SandboxError(f"cannot set up the setup's network: {exc}",
                                   "The engine must be able to create networks; or give "
                                   "--setup-network full (or none).") from None
            ours = self._authority(proxy, immutable, bundle) if immutable and bundle else b""
            self.proxy_log = lambda: engine.container_logs(proxy)
            yield inside, f"http://{PROXY_ALIAS}:{PROXY_PORT}", ours

    def _authority(self, proxy: str, hosts: list[str], bundle: bytes) -> bytes:
        """The proxy's CA for `hosts`, made in its container by `egress.py --authority` from
        the host's bundle (sent on stdin, to verify the hosts with): its certificate, one PEM
        block and nothing else. Only once it is taken is the proxy told to use it
        (`--enable`): setup is never answered with a CA it lacks. b"" when it cannot be made,
        with `authority_failed` saying why: the proxy then tunnels those hosts as it does any
        other (and so it does, with the CA taken, if `--enable` fails)."""
        argv = ["/usr/bin/python3", "-I", "-S", "-c", egress_source()]
        try:
            exec_id, sock = self.engine.exec_open(proxy, [*argv, "--authority", *hosts],
                                                  user=f"{UID}:{GID}", stdin=True)
            stream = ExecStream(sock)
            stream.deadline = time.monotonic() + deadlines.stretched(AUTHORITY_S)
            out, err = bytearray(), bytearray()
            try:
                stream.send(f"{len(bundle)}\n".encode() + bundle)
                while (frame := stream.frame()) is not None and len(out) + len(err) < 1 << 16:
                    (out if frame[0] == 1 else err).extend(frame[1][: 1 << 16])
            finally:
                stream.close()
            code = self.engine.exec_exit_code(exec_id)
        except (EngineError, SandboxError, OSError) as exc:  # a deadline too
            self.authority_failed = str(exc)
            return b""
        if code != 0 or not _ONE_CERTIFICATE.fullmatch(bytes(out)):
            self.authority_failed = (f"exit {code}: " + err.decode(errors="replace").strip())[-300:]
            return b""
        try:
            enabled, said = self.engine.exec_run(proxy, [*argv, "--enable"], f"{UID}:{GID}")
        except EngineError as exc:
            enabled, said = -1, str(exc).encode()
        if enabled != 0:
            self.authority_failed = f"--enable exited {enabled}: {said.decode(errors='replace')}"
        return bytes(out).strip() + b"\n"

    def _start_helper(self, container_id: str, image: str | None = None,
                      env: dict[str, str] | None = None, network_allowed: bool = False
                      ) -> DockerSandbox:
        image = image or self.image
        exec_id, sock = self.engine.exec_open(
            container_id, helper_argv(*(["--network-allowed"] if network_allowed else [])),
            user=f"{UID}:{GID}", stdin=True)
        transport = ExecTransport(self.engine, exec_id, sock)
        box = DockerSandbox(transport, self, container_id, env)
        try:
            check_isolation(box, f"the container from {image}")
        except (SandboxError, ToolFailure) as exc:
            try:
                code = transport.exit_code()
            except EngineError:  # the error at hand says more
                code = None
            if code in (126, 127):
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
                    mode_args: list[str] | None = None, uid: int = COMMAND_UID,
                    prepare_first: PrepareFirst | None = None, feed: bytes | None = None
                    ) -> CommandResult:
        """Run `command` in its own exec as COMMAND_UID, which cannot reach the helper. The
        host reads and caps its output; past the timeout plus a margin, every process of that
        uid is killed; if even that fails, the container is removed (SandboxError).
        `mode_args`: another of the supervisor's modes (--prepare, --snapshot) instead.
        `prepare_first`: a --prepare in the same exec, before the command. `feed`: the
        exec's stdin (a --prepare's tree entries), sent as it starts."""
        started = time.monotonic()
        margin = deadlines.stretched(COMMAND_MARGIN_S + (PREPARE_S if prepare_first else 0.0))
        argv = mode_args if mode_args is not None else [
            *(prepare_first.args if prepare_first else []), "--run", str(timeout), command]
        if prepare_first is not None:
            feed = prepare_first.feed
        exec_id, stream = self._exec_command(container_id, argv,
                                             self.env if env is None else env, uid, feed)
        capture = OutputCapture()
        stream.deadline = started + timeout + margin
        overdue = False
        held = bytearray() if prepare_first else None  # the supervisor's stderr
        try:
            overdue = _pump(stream, capture, on_output, held)
            if overdue:
                self._kill_commands(container_id)
                stream.deadline = time.monotonic() + KILL_GRACE_S
                if _pump(stream, capture, on_output, held):
                    raise SandboxError(f"`{command}` did not stop after its {timeout:.0f} s "
                                       "timeout, even when killed; the sandbox was removed",
                                       "Rerun to resume; the commit is verified again.")
        finally:
            stream.close()
        try:
            code = self.engine.exec_exit_code(exec_id)
        except EngineError as exc:
            raise SandboxError(f"the engine did not say how `{command}` ended: {exc.message}",
                               "Nothing was recorded for it. Rerun to resume; the commit is "
                               "verified again.") from None
        if code is None or code >= 128:  # the supervisor itself may have been killed
            self._kill_commands(container_id)
        seconds = time.monotonic() - started
        if prepare_first is not None and held is not None:
            ended = code is not None and code < 128
            seconds = max(0.0, seconds - prepare_first.said(bytes(held), capture, ended))
        timed_out = overdue or (code == TIMED_OUT and seconds >= timeout)
        return CommandResult(command, -9 if code is None else code, timed_out, capture.text(),
                             capture.total, capture.truncated, round(seconds, 3))

    def _exec_command(self, container_id: str, argv: list[str], env: dict[str, str],
                      uid: int = COMMAND_UID, feed: bytes | None = None
                      ) -> tuple[str, ExecStream]:
        try:
            exec_id, sock = self.engine.exec_open(
                container_id, supervisor_argv(*argv), user=f"{uid}:{GID}",
                stdin=feed is not None, environment={**env, "RETCON_SANDBOX_SUPERVISE": "1"})
            stream = ExecStream(sock)
            if feed:
                _feed(stream, feed)
            return exec_id, stream
        except EngineError as exc:
            if not self.engine.is_running(container_id):
                raise SandboxError("the sandbox container stopped before a command could start",
                                   "Was it removed (`retcon-sandbox clean --all`, `docker rm`), "
                                   "or did the engine stop? Rerun to resume.") from None
            raise SandboxError(f"the sandbox could not start a command: {exc}") from None

    def _kill_commands(self, container_id: str) -> None:
        """SIGKILL every process of the commands' uid (`kill -9 -1` spares only the caller)."""
        try:
            self.engine.exec_run(container_id, ["/bin/sh", "-c", "kill -9 -1"],
                                 user=f"{COMMAND_UID}:{GID}")
        except EngineError as exc:
            if not self.engine.is_running(container_id):
                raise SandboxError("the sandbox container stopped while a command ran",
                                   "Was it removed (`retcon-sandbox clean --all`, `docker "
                                   "rm`)? Rerun to resume.") from None
            raise SandboxError(f"the sandbox could not stop its commands: {exc}; "
                               "it was removed", "Rerun to resume.") from None

    def reap(self) -> int:
        """Remove what killed runs of this spec left (the spec's lock keeps a live run of it
        away): a container its keeper could not end (killed between its creation and its
        start, when the keeper had not run yet), and setup networks. `clean` removes those of
        every run that is gone. The count of containers removed."""
        removed = 0
        for container_id, labels in self.engine.sandbox_containers().items():
            if labels.get(LABEL_SPEC) == self.spec_path:
                self.engine.remove_container(container_id)
                removed += 1
        for network_id in self.engine.sandbox_networks({LABEL_SPEC: self.spec_path}):
            self.engine.remove_network(network_id)
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
# The system's tools, never ones setup put first on PATH (the image's venv is the commands'),
# and no library an image's ENV would have them load from a folder setup may write.
SYSTEM_PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin; export PATH; "
SYSTEM_ENV = {"LD_PRELOAD": "", "LD_LIBRARY_PATH": "", "LD_AUDIT": ""}
CLOCK = f"{SYSTEM_PATH}date +%s.%N"  # the container's clock: what owned_files counts from
SECONDS = re.compile(r"[0-9]{10,11}\.[0-9]{9}")


def owned_files_command(since: str) -> str:
    """Every file of the commands' uid or group on the root file system (-xdev: not the tmpfs
    mounts, /proc or /sys) whose inode changed after `since` (a CLOCK reading), one dot each.
    A folder that cannot be listed but can be entered (where the uid may have written what no
    walk sees), or one of theirs, fails the count (X); one that can be neither is skipped
    (nothing of theirs is in it). So does any error of `find` (one that stopped half-way, one
    without the GNU predicates, which would count nothing): the engine counts then."""
    unlisted = "-type d ! \\( -readable -executable \\)"
    return (f"{SYSTEM_PATH}n=$(find / -xdev \\( {unlisted} \\( -executable -o -user "
            f"{COMMAND_UID} -o -group {GID} \\) -printf X -prune \\) -o \\( {unlisted} -prune "
            f"\\) -o \\( \\( -user {COMMAND_UID} -o -group {GID} \\) -newerct @{since} "
            '-printf . \\)) || exit 5; case "$n" in *X*) exit 3;; esac; printf %s "$n" | wc -c')


# The supervisor's line on its stderr after a --prepare in a command's exec: exit code, seconds
# and why (hex of UTF-8), as `prepare_first` in sandbox/supervisor.py writes it.
PREPARED_RECORD = b"retcon-sandbox-prepared"
PREPARE_S = COMMAND_MARGIN_S * 4  # the longest the git metadata takes (the supervisor's too)
HELD_MAX = 4096  # bytes of the supervisor's stderr held apart; the rest joins the output
FEED_S = COMMAND_MARGIN_S * 4  # the longest the tree's entries take to reach the supervisor


@dataclass(frozen=True)
class PrepareFirst:
    """A --prepare (`args`) made in a command's exec, before the command; `failed(exit code,
    why)` is called when it fails."""

    args: list[str]
    failed: Callable[[int, str], None] | None = None
    feed: bytes | None = None  # the exec's stdin: the tree's entries

    def said(self, held: bytes, capture: OutputCapture, ended: bool = True) -> float:
        """Read the supervisor's stderr (`held`): the seconds the --prepare took (not the
        command's). Anything but its record there (the supervisor's own failure) joins the
        output; no record, and it counts as failed, unless the supervisor did not end by itself
        (`ended` false: killed, or its container gone), which its exit code already tells."""
        line, _, rest = held.partition(b"\n")
        fields = line.split(b" ")
        try:
            if len(fields) != 4 or fields[0] != PREPARED_RECORD:
                raise ValueError
            code, seconds = int(fields[1]), float(fields[2])
            why = bytes.fromhex(fields[3].decode("ascii")).decode("utf-8", "replace")
        except ValueError:
            code, seconds, why, rest = (127 if ended else 0), 0.0, "", held
        if rest:
            capture.add(rest)
        if code and self.failed is not None:
            self.failed(code, why or "the supervisor did not say why")
        return seconds if 0.0 <= seconds < 1e6 else 0.0


def _pump(stream: ExecStream, capture: OutputCapture,
          on_output: Callable[[bytes], None] | None = None, held: bytearray | None = None
          ) -> bool:
    """Read a command's output to its end; True if the deadline passed first. `held`: where
    the supervisor's stderr goes, up to HELD_MAX bytes, instead of the output."""
    try:
        while (frame := stream.frame()) is not None:
            if held is not None and frame[0] == 2 and len(held) + len(frame[1]) <= HELD_MAX:
                held += frame[1]
                continue
            capture.add(frame[1])
            if on_output is not None:
                on_output(frame[1])
    except DeadlineExceeded:
        return True
    return False


def _prepare_args(git: bool, tag: str | None, distance: int, listing: bytes = b"") -> list[str]:
    """The supervisor's --prepare and its options, in the order it reads them."""
    return ["--prepare", *(["--git"] if git else []),
            *(["--index", str(len(listing))] if git and listing else []),
            *(["--tag", tag] if tag else []),
            *(["--distance", str(distance)] if tag and distance else [])]


def _feed(stream: ExecStream, data: bytes) -> None:
    """`data` on the exec's stdin, within FEED_S: the supervisor reads it all before anything
    else. An exec that ended first (no python3 in the image) is said by its exit code."""
    stream.deadline = time.monotonic() + FEED_S
    try:
        stream.send(data)
    except OSError:
        pass
    except DeadlineExceeded:
        stream.close()
        raise SandboxError(f"the sandbox did not take the tree's entries within {FEED_S:.0f} s",
                           "Rerun to resume; the commit is verified again.") from None
    stream.deadline = None


def keeper_kwargs(lifetime: float) -> dict[str, Any]:
    """The create arguments of a container whose first process is the keeper: its input open
    for the run to hold (`Leases`), closed when the run's connection closes (StdinOnce, which
    the SDK sets for stdin_open without detach), and removed by the engine once it ends."""
    return {"entrypoint": ["/bin/sh"],
            "command": ["-c", _KEEP, "retcon-keeper", "-c", keeper_source(), str(LEASE_S),
                        str(lifetime)],
            "stdin_open": True, "detach": False, "auto_remove": True}


def python_argv(name: str, source: str, *args: str) -> list[str]:
    """`source` run by the image's system python3 (see PYTHONS) with `args`; `name` is its
    argv[0] in the container's process list."""
    return ["/bin/sh", "-c", _LAUNCH, name, "-c", source, *args]


def helper_argv(*args: str) -> list[str]:
    """The in-container helper's command line."""
    return python_argv("retcon-helper", helper_source(), "--workspace", "/workspace", *args)


def supervisor_argv(*args: str) -> list[str]:
    """A supervised mode's command line: sandbox/supervisor.py, not the whole helper, which
    would cost about as much CPU again as the exec itself."""
    return python_argv("retcon-supervisor", supervisor_source(), *args)


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


def _wait_listening(engine: DockerEngine, proxy: str, ready_s: float = PROXY_READY_S) -> None:
    """Until the egress proxy says it listens, within `ready_s` stretched by this machine's
    load (a busy machine starts it slowly). A proxy that stopped, or that did not say it in
    time, is an error that says which, with what it wrote."""
    limit = deadlines.stretched(ready_s)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        logs = engine.container_logs(proxy)
        if "listening on" in logs:
            return
        if KEEPER_SAID_ENDED in logs or \
                engine.container_status(proxy) not in ("created", "running"):
            raise SandboxError("the setup's egress proxy stopped before it listened: "
                               + _said(engine.container_logs(proxy)),
                               "Rebuild our base image (`retcon-sandbox images build base`), "
                               "or give --setup-network full (or none); report it if it "
                               "stops again.")
        time.sleep(0.2)
    raise SandboxError(f"the setup's egress proxy did not say it was listening within "
                       f"{limit:.0f} s ({deadlines.busy_note()}): "
                       + _said(engine.container_logs(proxy)),
                       "A busy machine or engine starts it slowly: rerun when it is less "
                       "loaded, or give --setup-network full (or none), which needs no proxy.")


KEEPER_SAID_ENDED = "retcon-keeper: the command ended"  # sandbox/keeper.py's line
AUTHORITY_S = 30.0  # for the proxy to make its CA (two EC keys, two certificates)
_ONE_CERTIFICATE = re.compile(rb"\s*-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+"
                              rb"-----END CERTIFICATE-----\s*")


def _said(logs: str) -> str:
    """The last of what a container wrote, or that it wrote nothing."""
    text = logs.strip()[-500:]
    return text if text else "it wrote nothing"
