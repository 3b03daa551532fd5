"""Which Docker engine to talk to, chosen as the docker CLI chooses it, without importing docker.

In order: DOCKER_HOST; the context named by DOCKER_CONTEXT, else the `currentContext` of the
docker CLI's config.json (in DOCKER_CONFIG, default ~/.docker), read from the CLI's context store
(`contexts/meta/<sha256 of the name>/meta.json`, its TLS files beside it in `contexts/tls/`);
else the default socket. `--engine` (HOST or a context's name, repeatable for `verify`) comes
before all of them. The result is the environment docker's own `from_env` reads, so a
context's engine is reached with the same code as DOCKER_HOST's, and a description printed in
every run's header and `--json`.

`ssh://` engines need paramiko (`pip install 'retcon-sandbox[ssh]'`). Podman's Docker API is
recognised from its version and refused: it rejects the tmpfs `uid=` option every sandbox uses.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retcon_sandbox.errors import SandboxError

DEFAULT_HOST = "unix:///var/run/docker.sock"


@dataclass(frozen=True)
class Endpoint:
    host: str  # unix://…, tcp://…, ssh://…, npipe://…
    source: str  # "DOCKER_HOST", "context NAME" or "default"
    environment: Mapping[str, str] = field(default_factory=dict)  # for docker.from_env

    def describe(self) -> str:
        return self.host if self.source == "default" else f"{self.host} ({self.source})"


def config_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("DOCKER_CONFIG") or Path(env.get("HOME") or Path.home()) / ".docker")


def current_context(env: Mapping[str, str]) -> str | None:
    """DOCKER_CONTEXT, else config.json's currentContext; None for the default context."""
    name = env.get("DOCKER_CONTEXT")
    if name is None:
        path = config_dir(env) / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SandboxError(f"cannot read the docker CLI's configuration {path}: {exc}",
                               "Fix or remove it, or set DOCKER_HOST.") from None
        name = data.get("currentContext") if isinstance(data, dict) else None
    return None if not name or name == "default" else str(name)


def from_context(env: Mapping[str, str], name: str) -> Endpoint:
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    store = config_dir(env) / "contexts"
    meta = store / "meta" / digest / "meta.json"
    try:
        data: Any = json.loads(meta.read_text(encoding="utf-8"))
        docker_endpoint = data["Endpoints"]["docker"]
        host = str(docker_endpoint["Host"])
    except FileNotFoundError:
        raise SandboxError(f"the docker context {name!r} does not exist (no {meta})",
                           "List them with `docker context ls`; choose one with `docker context "
                           "use NAME` or DOCKER_CONTEXT, or set DOCKER_HOST.") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"cannot read the docker context {name!r} ({meta}): {exc!r}",
                           "Recreate it with `docker context create`, or set DOCKER_HOST."
                           ) from None
    environment = {"DOCKER_HOST": host}
    tls = store / "tls" / digest / "docker"
    if tls.is_dir():
        environment["DOCKER_CERT_PATH"] = str(tls)
        if not docker_endpoint.get("SkipTLSVerify"):
            environment["DOCKER_TLS_VERIFY"] = "1"
    return Endpoint(host, f"context {name}", environment)


def select(env: Mapping[str, str] | None = None, given: str | None = None) -> Endpoint:
    """The engine the docker CLI would use, with the environment docker.from_env needs; or the
    one `given` by `--engine`: a host (`unix://`, `tcp://`, `ssh://`) or a context's name."""
    endpoint = locate(os.environ if env is None else env, given)
    check_transport(endpoint)
    return endpoint


def locate(env: Mapping[str, str], given: str | None = None) -> Endpoint:
    """Where the engine is, before asking whether it can be reached."""
    if given:
        return from_option(env, given)
    if env.get("DOCKER_HOST"):
        return Endpoint(env["DOCKER_HOST"], "DOCKER_HOST", dict(env))
    name = current_context(env)
    return from_context(env, name) if name else Endpoint(DEFAULT_HOST, "default", dict(env))


def from_option(env: Mapping[str, str], given: str) -> Endpoint:
    """`--engine HOST` (anything with `://`) or `--engine CONTEXT`."""
    if "://" not in given:
        return from_context(env, given)
    environment = {k: v for k, v in env.items() if k not in ("DOCKER_CONTEXT",)}
    environment["DOCKER_HOST"] = given
    return Endpoint(given, "--engine", environment)


def select_all(given: Sequence[str], env: Mapping[str, str] | None = None) -> list[Endpoint]:
    """The engines `--engine` names (each once, in order), or the one the docker CLI would
    use when none is given."""
    if not given:
        return [select(env)]
    return [select(env, one) for one in dict.fromkeys(given)]


def hosts(given: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The hosts select_all would reach, without needing their transport installed."""
    env = os.environ if env is None else env
    if not given:
        return [locate(env).host]
    return [locate(env, one).host for one in dict.fromkeys(given)]


def describe_all(endpoints: Sequence[Endpoint]) -> str:
    return " + ".join(endpoint.describe() for endpoint in endpoints)


def check_transport(endpoint: Endpoint) -> None:
    """An ssh:// engine needs paramiko, which is optional: say how to get it."""
    if endpoint.host.startswith("ssh://") and importlib.util.find_spec("paramiko") is None:
        raise SandboxError(f"the engine {endpoint.describe()} is reached over SSH, which needs "
                           "the optional dependency paramiko",
                           "Install it with `pip install 'retcon-sandbox[ssh]'`, or use a local "
                           "socket or tcp:// engine.")


def refuse_unsupported(endpoint: Endpoint, version: Mapping[str, Any]) -> None:
    """Podman answers the Docker API, but refuses the tmpfs `uid=` option every sandbox's
    writable folders need: say so rather than fail at the first sandbox."""
    names = [str((version.get("Platform") or {}).get("Name", ""))]
    names += [str(c.get("Name", "")) for c in version.get("Components") or ()
              if isinstance(c, Mapping)]
    if any("podman" in n.lower() for n in names):
        raise SandboxError(
            f"the engine at {endpoint.describe()} is Podman ({version.get('Version', '?')}), "
            "which retcon-sandbox does not support: its Docker API rejects the tmpfs `uid=` "
            "option that gives each sandbox's writable folders to the sandbox user",
            "Use a Docker engine (DOCKER_HOST, or `docker context use NAME`).")
