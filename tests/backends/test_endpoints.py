"""Choosing the engine as the docker CLI does: DOCKER_HOST, then the current context (from
DOCKER_CONTEXT or config.json) read from a real context store layout, then the default socket;
ssh:// needs the optional paramiko; Podman is refused by name."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker import endpoints
from retcon_sandbox.errors import SandboxError


def store(config: Path, name: str, host: str, tls: bool = False, skip_verify: bool = False,
          current: bool = True) -> None:
    """What `docker context create NAME --docker host=HOST[,ca=…,cert=…,key=…]` writes."""
    digest = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / digest
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({
        "Name": name, "Metadata": {},
        "Endpoints": {"docker": {"Host": host, "SkipTLSVerify": skip_verify}}}))
    if tls:
        folder = config / "contexts" / "tls" / digest / "docker"
        folder.mkdir(parents=True)
        for pem in ("ca.pem", "cert.pem", "key.pem"):
            (folder / pem).write_text("")
    if current:
        (config / "config.json").write_text(json.dumps({"auths": {}, "currentContext": name}))


def test_docker_host_wins_over_any_context(tmp_path: Path) -> None:
    store(tmp_path, "remote", "tcp://10.0.0.1:2376")
    chosen = endpoints.select({"DOCKER_HOST": "tcp://127.0.0.1:2375",
                             "DOCKER_CONFIG": str(tmp_path)})
    assert (chosen.host, chosen.source) == ("tcp://127.0.0.1:2375", "DOCKER_HOST")
    assert chosen.describe() == "tcp://127.0.0.1:2375 (DOCKER_HOST)"


def test_the_current_context_of_config_json(tmp_path: Path) -> None:
    store(tmp_path, "remote", "tcp://10.0.0.1:2376", tls=True)
    chosen = endpoints.select({"DOCKER_CONFIG": str(tmp_path)})
    assert chosen.describe() == "tcp://10.0.0.1:2376 (context remote)"
    tls = tmp_path / "contexts" / "tls" / hashlib.sha256(b"remote").hexdigest() / "docker"
    assert chosen.environment == {"DOCKER_HOST": "tcp://10.0.0.1:2376",
                                  "DOCKER_CERT_PATH": str(tls), "DOCKER_TLS_VERIFY": "1"}


def test_docker_context_names_another_and_skip_verify_is_kept(tmp_path: Path) -> None:
    store(tmp_path, "remote", "tcp://10.0.0.1:2376")
    store(tmp_path, "lab", "tcp://10.0.0.2:2376", tls=True, skip_verify=True, current=False)
    chosen = endpoints.select({"DOCKER_CONFIG": str(tmp_path), "DOCKER_CONTEXT": "lab"})
    assert chosen.source == "context lab"
    assert "DOCKER_TLS_VERIFY" not in chosen.environment
    assert "DOCKER_CERT_PATH" in chosen.environment


def test_the_default_context_and_no_config_mean_the_default_socket(tmp_path: Path) -> None:
    for env in ({"DOCKER_CONFIG": str(tmp_path)},
                {"DOCKER_CONFIG": str(tmp_path), "DOCKER_CONTEXT": "default"},
                {"HOME": str(tmp_path / "nobody")}):
        chosen = endpoints.select(env)
        assert (chosen.host, chosen.source) == (endpoints.DEFAULT_HOST, "default")
        assert chosen.describe() == endpoints.DEFAULT_HOST


def test_a_missing_or_broken_context_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"currentContext": "gone"}))
    with pytest.raises(SandboxError, match="the docker context 'gone' does not exist"):
        endpoints.select({"DOCKER_CONFIG": str(tmp_path)})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SandboxError, match="cannot read the docker CLI's configuration"):
        endpoints.select({"DOCKER_CONFIG": str(tmp_path)})
    store(tmp_path / "b", "odd", "tcp://x:1")
    meta = next((tmp_path / "b" / "contexts" / "meta").iterdir()) / "meta.json"
    meta.write_text(json.dumps({"Name": "odd", "Endpoints": {}}))
    with pytest.raises(SandboxError, match="cannot read the docker context 'odd'"):
        endpoints.select({"DOCKER_CONFIG": str(tmp_path / "b")})


def test_ssh_without_paramiko_says_which_extra_to_install(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "paramiko", None)  # as if the `ssh` extra were missing
    assert importlib.util.find_spec("paramiko") is None
    with pytest.raises(SandboxError) as raised:
        endpoints.select({"DOCKER_HOST": "ssh://me@build-box"})
    assert "paramiko" in raised.value.message
    assert raised.value.hint is not None and "retcon-sandbox[ssh]" in raised.value.hint
    store(tmp_path, "box", "ssh://me@build-box")
    with pytest.raises(SandboxError, match="context box"):
        endpoints.select({"DOCKER_CONFIG": str(tmp_path)})


# `GET /version` of Podman 4.9's Docker-compatible API, and of Docker 20.10.
PODMAN = {"Platform": {"Name": "linux/amd64/fedora-39"}, "Version": "4.9.4",
          "Components": [{"Name": "Podman Engine", "Version": "4.9.4"},
                         {"Name": "Conmon", "Version": "conmon version 2.1.8"}]}
DOCKER = {"Platform": {"Name": "Docker Engine - Community"}, "Version": "20.10.24",
          "Components": [{"Name": "Engine", "Version": "20.10.24"},
                         {"Name": "containerd", "Version": "1.6.20"}]}


def test_podman_is_refused_naming_what_it_lacks() -> None:
    endpoint = endpoints.Endpoint("unix:///run/podman/podman.sock", "DOCKER_HOST")
    with pytest.raises(SandboxError) as raised:
        endpoints.refuse_unsupported(endpoint, PODMAN)
    message = raised.value.message
    assert "is Podman (4.9.4)" in message and "tmpfs `uid=`" in message
    assert "unix:///run/podman/podman.sock (DOCKER_HOST)" in message
    endpoints.refuse_unsupported(endpoint, DOCKER)  # a Docker engine passes
    endpoints.refuse_unsupported(endpoint, {})  # and so does an engine that says little


def test_engine_option_wins_and_names_a_host_or_a_context(tmp_path: Path) -> None:
    store(tmp_path, "lab", "tcp://10.0.0.2:2376", current=False)
    env = {"DOCKER_HOST": "tcp://127.0.0.1:2375", "DOCKER_CONFIG": str(tmp_path),
           "DOCKER_CONTEXT": "lab"}
    given = endpoints.select(env, "tcp://127.0.0.1:4243")
    assert given.describe() == "tcp://127.0.0.1:4243 (--engine)"
    assert given.environment["DOCKER_HOST"] == "tcp://127.0.0.1:4243"
    assert "DOCKER_CONTEXT" not in given.environment
    assert endpoints.select(env, "lab").describe() == "tcp://10.0.0.2:2376 (context lab)"
    with pytest.raises(SandboxError, match="the docker context 'gone' does not exist"):
        endpoints.select(env, "gone")


def test_several_engines_in_order_each_once(tmp_path: Path) -> None:
    env = {"DOCKER_HOST": "tcp://127.0.0.1:2375", "DOCKER_CONFIG": str(tmp_path)}
    assert [e.host for e in endpoints.select_all([], env)] == ["tcp://127.0.0.1:2375"]
    chosen = endpoints.select_all(["unix:///a.sock", "tcp://127.0.0.1:1", "unix:///a.sock"], env)
    assert [e.host for e in chosen] == ["unix:///a.sock", "tcp://127.0.0.1:1"]
    assert endpoints.describe_all(chosen) == \
        "unix:///a.sock (--engine) + tcp://127.0.0.1:1 (--engine)"
