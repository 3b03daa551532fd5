"""The egress proxy answers CONNECTs to an immutable host itself (`--immutable`): its own CA,
name-constrained to those hosts; each request sent on over a verified TLS connection of its
own; Cache-Control restored on files under the prefix only. Real TLS on loopback, real openssl
certificates; the upstream is a local TLS server standing in for files.pythonhosted.org."""

from __future__ import annotations

import asyncio
import importlib
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

egress = importlib.import_module("retcon_sandbox.sandbox.egress")

HOST = "files.example.test"
FILE = b"wheel bytes " * 100


@pytest.fixture
def certificates(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the upstream's folder: its CA and its certificate for HOST; the proxy's folder: its
    own authority, which trusts the upstream's CA)."""
    upstream, proxy = tmp_path / "upstream", tmp_path / "proxy"
    upstream_ca = egress.authority([HOST], b"", str(upstream))
    egress.authority([HOST], upstream_ca, str(proxy))
    yield upstream, proxy


async def answer_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          seen: list[bytes]) -> None:
    """The upstream: one request per connection, as the proxy asks (Connection: close)."""
    head = await reader.readuntil(b"\r\n\r\n")
    seen.append(head)
    path = head.split(b" ")[1]
    body = FILE if path.startswith(b"/packages/") else b"index"
    status = b"404 Not Found" if path.endswith(b"missing") else b"200 OK"
    writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    writer.close()


async def through_proxy(upstream: Path, proxy: Path, requests: list[bytes]
                        ) -> tuple[list[bytes], list[bytes]]:
    """`requests` sent one after another on one CONNECT through `intercept`: (what the
    upstream received, each answer's bytes as the client read them)."""
    seen: list[bytes] = []
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(upstream / "leaf.pem", upstream / "leaf.key")
    up_server = await asyncio.start_server(lambda r, w: answer_requests(r, w, seen),
                                           "127.0.0.1", 0, ssl=serving)
    up_port = up_server.sockets[0].getsockname()[1]
    made = egress._contexts(str(proxy))
    assert made is not None

    async def proxy_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the CONNECT
        await egress.intercept(reader, writer, HOST, "127.0.0.1", egress.Activity(30), made,
                               up_port)

    proxy_server = await asyncio.start_server(proxy_client, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy_server.sockets[0].getsockname()[1])
    writer.write(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    client = ssl.create_default_context(cafile=str(proxy / "ca.pem"))
    client.verify_flags |= ssl.VERIFY_X509_STRICT  # as Python 3.13's pip verifies
    await writer.start_tls(client, server_hostname=HOST)
    answers = []
    for request in requests:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = [line.split(b":")[1] for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:")]
        answers.append(head + await reader.readexactly(int(length[0])))
    writer.close()
    up_server.close()
    proxy_server.close()
    return seen, answers


def get(path: str, *headers: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", f"Host: {HOST}", *headers, "", ""]).encode()


def test_files_under_the_prefix_get_their_cache_control_back(
        certificates: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Three requests on one client connection, each on an upstream connection of its own:
    the file under /packages/ is marked immutable, the index and a 404 are not."""
    monkeypatch.setitem(egress.IMMUTABLE, HOST, "/packages/")
    seen, answers = asyncio.run(through_proxy(*certificates, [
        get("/packages/ab/cd/x-1.0-py3-none-any.whl", "Connection: keep-alive"),
        get("/simple/x/"), get("/packages/missing")]))
    assert len(seen) == 3
    assert all(b"\r\nConnection: close\r\n" in head and f"\r\nHost: {HOST}\r\n".encode() in head
               and b"keep-alive" not in head for head in seen)
    assert answers[0].endswith(FILE) and egress.CACHE_CONTROL in answers[0]
    assert b"Connection: close" not in answers[0]  # the client's connection stays open
    assert answers[1].endswith(b"index") and b"Cache-Control" not in answers[1]
    assert answers[2].startswith(b"HTTP/1.1 404") and b"Cache-Control" not in answers[2]


def test_a_request_with_a_body_or_another_method_is_refused(
        certificates: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(egress.IMMUTABLE, HOST, "/packages/")
    for request in (b"POST /packages/x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                    get("/packages/x", "Transfer-Encoding: chunked"),
                    b"GET http://elsewhere.test/x HTTP/1.1\r\n\r\n"):
        seen, answers = asyncio.run(through_proxy(*certificates, [request]))
        assert seen == [] and answers[0].startswith(b"HTTP/1.1 403"), answers


def test_an_upstream_the_hosts_bundle_does_not_trust_is_refused(
        tmp_path: Path, certificates: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy verifies the host with the host's CA bundle: a certificate it does not
    trust (here: the proxy's own bundle holds another CA) gives 502, nothing relayed."""
    monkeypatch.setitem(egress.IMMUTABLE, HOST, "/packages/")
    upstream, _ = certificates
    other = tmp_path / "other"
    egress.authority([HOST], egress.authority([HOST], b"", str(tmp_path / "stranger")),
                     str(other))
    seen, answers = asyncio.run(through_proxy(upstream, other, [get("/packages/x")]))
    assert seen == [] and answers[0].startswith(b"HTTP/1.1 502")
    assert b"certificate verify failed" in answers[0]


def test_the_proxys_authority_can_sign_for_its_hosts_only(tmp_path: Path) -> None:
    """Even with its key, the CA cannot stand for another host: its name constraints hold
    it to the hosts it was made for."""
    folder = tmp_path / "proxy"
    egress.authority([HOST], b"", str(folder))
    (tmp_path / "evil.ext").write_text("subjectAltName=DNS:pypi.org\n")
    for argv in (["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", "evil.key", "-out", "evil.csr", "-subj", "/CN=pypi.org"],
                 ["x509", "-req", "-in", "evil.csr", "-CA", str(folder / "ca.pem"), "-CAkey",
                  str(folder / "ca.key"), "-set_serial", "7", "-days", "1", "-out", "evil.pem",
                  "-extfile", "evil.ext"]):
        subprocess.run(["openssl", *argv], cwd=tmp_path, check=True, capture_output=True)
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(folder / "ca.pem"),
                               str(tmp_path / "evil.pem")], capture_output=True, text=True)
    assert verified.returncode != 0 and "permitted subtree violation" in verified.stderr
    ours = subprocess.run(["openssl", "verify", "-CAfile", str(folder / "ca.pem"),
                           str(folder / "leaf.pem")], capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    assert oct((folder).stat().st_mode & 0o777) == "0o700"


def test_the_authority_is_made_from_a_bundle_on_stdin(tmp_path: Path) -> None:
    """`--authority HOST`: the bundle's length, then the bundle, in; the CA's certificate,
    alone, out. A length that is not a number fails with a message."""
    source = Path(str(egress.__file__)).read_text()
    bundle = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"
    made = subprocess.run(["python3", "-I", "-S", "-c", source, "--authority", HOST],
                          input=f"{len(bundle)}\n".encode() + bundle, capture_output=True,
                          env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.count(b"BEGIN CERTIFICATE") == 1 and b"PRIVATE" not in made.stdout
    bad = subprocess.run(["python3", "-I", "-S", "-c", source, "--authority", HOST],
                         input=b"lots\n", capture_output=True)
    assert bad.returncode != 0 and b"--authority" in bad.stderr
