"""The egress proxy answers CONNECTs to an immutable host itself (`--immutable`): its own CA,
name-constrained to those hosts; each request sent on over a verified TLS connection of its
own, its answer copied by its length and no further; Cache-Control restored on PyPI's files
only. Real TLS on loopback, real openssl certificates; the upstream is a local TLS server
standing in for files.pythonhosted.org."""

from __future__ import annotations

import asyncio
import importlib
import re
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.backends.hostaccess import IMMUTABLE

egress = importlib.import_module("retcon_sandbox.sandbox.egress")

HOST = "files.example.test"
FILE = b"wheel bytes " * 100
WHEEL = "/packages/ab/cd/" + "0123456789abcdef" * 3 + "0123456789ab/x-1.0-py3-none-any.whl"


@pytest.fixture
def certificates(tmp_path: Path, some_ca: bytes) -> Iterator[tuple[Path, Path]]:
    """(the upstream's folder: its CA and its certificate for HOST; the proxy's folder: its
    own authority, which trusts the upstream's CA)."""
    upstream, proxy = tmp_path / "upstream", tmp_path / "proxy"
    upstream_ca = egress.authority([HOST], some_ca, str(upstream))
    egress.enable(str(upstream))
    egress.authority([HOST], upstream_ca, str(proxy))
    egress.enable(str(proxy))
    yield upstream, proxy


@pytest.fixture(autouse=True)
def pypi_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOST's files are PyPI's, as the host names them."""
    monkeypatch.setitem(egress.IMMUTABLE, HOST, re.compile(IMMUTABLE["files.pythonhosted.org"]))


@pytest.fixture(scope="module")
def some_ca(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A bundle that loads: one self-signed CA certificate."""
    folder = tmp_path_factory.mktemp("some-ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "key.pem", "-out",
                    "ca.pem", "-days", "1", "-subj", "/CN=some CA"], cwd=folder, check=True,
                   capture_output=True)
    return (folder / "ca.pem").read_bytes()


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
    if path.endswith(b"lies"):  # more than its length says: a second answer, never asked for
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL")
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


def test_pypis_files_get_their_cache_control_back(certificates: tuple[Path, Path]) -> None:
    """Four requests on one client connection, each on an upstream connection of its own:
    the file named by its hash is marked immutable; the index, a 404 and a path that only
    starts like a file's are not."""
    seen, answers = asyncio.run(through_proxy(*certificates, [
        get(WHEEL, "Connection: keep-alive"), get("/simple/x/"), get("/packages/missing"),
        get(WHEEL.rsplit("/", 1)[0] + "/../../../../simple/x/")]))
    assert len(seen) == 4
    assert all(b"\r\nConnection: close\r\n" in head and f"\r\nHost: {HOST}\r\n".encode() in head
               and b"keep-alive" not in head for head in seen)
    assert answers[0].endswith(FILE) and egress.CACHE_CONTROL in answers[0]
    assert b"Connection: close" not in answers[0]  # the client's connection stays open
    assert answers[1].endswith(b"index") and b"Cache-Control" not in answers[1]
    assert answers[2].startswith(b"HTTP/1.1 404") and b"Cache-Control" not in answers[2]
    assert answers[3].endswith(FILE) and b"Cache-Control" not in answers[3]


def test_an_answer_is_copied_by_its_length_and_no_further(
        certificates: tuple[Path, Path]) -> None:
    """An upstream that sends more than its Content-Length cannot answer the client's next
    request: that request reaches the upstream, and its own answer comes back."""
    seen, answers = asyncio.run(through_proxy(*certificates, [get("/packages/lies"),
                                                              get(WHEEL)]))
    assert len(seen) == 2 and b"EVIL" not in b"".join(answers)
    assert answers[0].endswith(FILE) and answers[1].endswith(FILE)


def test_a_request_with_a_body_or_another_method_is_refused(
        certificates: tuple[Path, Path]) -> None:
    for request in (b"POST /packages/x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                    get("/packages/x", "Transfer-Encoding: chunked"),
                    b"GET http://elsewhere.test/x HTTP/1.1\r\n\r\n"):
        seen, answers = asyncio.run(through_proxy(*certificates, [request]))
        assert seen == [] and answers[0].startswith(b"HTTP/1.1 403"), answers


def test_an_upstream_the_hosts_bundle_does_not_trust_is_refused(
        tmp_path: Path, certificates: tuple[Path, Path], some_ca: bytes) -> None:
    """The proxy verifies the host with the host's CA bundle: a certificate it does not
    trust (here: the proxy's own bundle holds another CA) gives 502, nothing relayed."""
    upstream, _ = certificates
    other = tmp_path / "other"
    egress.authority([HOST], some_ca, str(other))
    egress.enable(str(other))
    seen, answers = asyncio.run(through_proxy(upstream, other, [get("/packages/x")]))
    assert seen == [] and answers[0].startswith(b"HTTP/1.1 502")
    assert b"certificate verify failed" in answers[0]


def test_the_proxys_authority_can_sign_for_its_hosts_only(tmp_path: Path, some_ca: bytes
                                                         ) -> None:
    """Even with its key, the CA cannot stand for another host, nor for any IP address: its
    name constraints hold it to the hosts it was made for."""
    folder = tmp_path / "proxy"
    egress.authority([HOST], some_ca, str(folder))
    for name, violation in (("DNS:pypi.org", "permitted"), ("IP:151.101.0.223", "excluded"),
                            ("IP:2a04:4e42::223", "excluded")):
        (tmp_path / "evil.ext").write_text(f"subjectAltName={name}\n")
        for argv in (["req", "-new", "-newkey", "ec", "-pkeyopt",
                      "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "evil.key", "-out",
                      "evil.csr", "-subj", "/CN=evil"],
                     ["x509", "-req", "-in", "evil.csr", "-CA", str(folder / "ca.pem"),
                      "-CAkey", str(folder / "ca.key"), "-set_serial", "7", "-days", "1",
                      "-out", "evil.pem", "-extfile", "evil.ext"]):
            subprocess.run(["openssl", *argv], cwd=tmp_path, check=True, capture_output=True)
        verified = subprocess.run(["openssl", "verify", "-CAfile", str(folder / "ca.pem"),
                                   str(tmp_path / "evil.pem")], capture_output=True, text=True)
        assert verified.returncode != 0, name
        assert f"{violation} subtree violation" in verified.stderr, (name, verified.stderr)
    assert egress._contexts(str(folder)) is None  # not used before `enable`
    egress.enable(str(folder))
    ours = subprocess.run(["openssl", "verify", "-CAfile", str(folder / "ca.pem"),
                           str(folder / "leaf.pem")], capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    assert egress._contexts(str(folder)) is not None
    assert oct((folder).stat().st_mode & 0o777) == "0o700"


def test_the_authority_is_made_from_a_bundle_on_stdin(tmp_path: Path, some_ca: bytes) -> None:
    """`--authority HOST`: the bundle's length, then the bundle, in; the CA's certificate,
    alone, out; `--enable` turns it on. A length that is not a number, or a bundle that will
    not load (which would fail every request later), fails with a message."""
    source = Path(str(egress.__file__)).read_text()
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def run(*args: str, given: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["python3", "-I", "-S", "-c", source, *args], input=given,
                              capture_output=True, env=env, cwd=tmp_path)

    junk = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"
    refused = run("--authority", HOST, given=f"{len(junk)}\n".encode() + junk)
    assert refused.returncode != 0 and b"--authority" in refused.stderr
    bundle = some_ca
    made = run("--authority", HOST, given=f"{len(bundle)}\n".encode() + bundle)
    assert made.returncode == 0, made.stderr
    assert made.stdout.count(b"BEGIN CERTIFICATE") == 1 and b"PRIVATE" not in made.stdout
    assert not (tmp_path / "retcon-authority" / "leaf.pem").exists()
    assert run("--enable").returncode == 0
    assert (tmp_path / "retcon-authority" / "leaf.pem").exists()
    bad = run("--authority", HOST, given=b"lots\n")
    assert bad.returncode != 0 and b"--authority" in bad.stderr


def test_bytes_sent_before_the_connects_answer_are_refused(
        certificates: tuple[Path, Path]) -> None:
    """They would be read as if they came inside the TLS: the CONNECT is refused."""
    made = egress._contexts(str(certificates[1]))
    assert made is not None

    async def scenario() -> bytes:
        async def proxy_client(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(0.2)  # the early bytes are in
            await egress.intercept(reader, writer, HOST, "127.0.0.1", egress.Activity(30), made)

        server = await asyncio.start_server(proxy_client, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(f"CONNECT {HOST}:443 HTTP/1.1\r\n\r\n".encode() + get(WHEEL))
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        server.close()
        return answer

    assert asyncio.run(scenario()).startswith(b"HTTP/1.1 403")
