"""retcon-sandbox's egress proxy for `[sandbox] setup`. Standard library only; Python 3.8+.

Started in a container of its own (`python3 -I -S -c <this file> PORT HOST...`) that sits on two
networks: an internal one, where the setup container is and which has no other way out, and an
ordinary one. It answers HTTP proxy requests (CONNECT for HTTPS, absolute URIs for plain HTTP)
for the registries named on its command line only (`pypi.org`, or `.debian.org` for every host
under it): CONNECT to port 443, plain HTTP to port 80 with the Host header set to the URL's
host. It never connects to a loopback, private, link-local (169.254.169.254, cloud metadata),
shared, multicast or reserved address, nor an IPv6 address embedding one (BLOCKED): it resolves
the name itself, checks every address, and connects to the address it checked. TLS passes
through untouched, except for immutable files (below). A request head must arrive within
HEAD_TIMEOUT seconds, and at most MAX_CLIENTS connections are served at once: when all are
taken, the one idle longest (no byte either way for EVICT_IDLE seconds at least) is closed for
a new client, so idle tunnels cannot lock others out. Each decision is one line on stderr,
which the host reads, and so is each connection's end, with the bytes it carried each way
(`closed HOST:PORT up N down M`: what setup downloaded).

The engine host's own addresses are refused too, whatever range they are in: those the host
names (`--block=ADDR`: every network's gateway and, for a local engine, its interfaces), and
this container's gateways and own addresses. `--allow=NET` (the user's --setup-allow-address)
lifts the block of a documentation, private or reserved range for the addresses in NET, never
for loopback, link-local, unspecified or multicast ones (NEVER) nor the host's.

A plain HTTP connection carries one request and its response, then closes (a second, pipelined
request never reaches the upstream, which may serve other hosts); a request body is forwarded by
its Content-Length only. A tunnel (CONNECT) idle in both directions for IDLE_TIMEOUT seconds is
closed.

Immutable files (`--immutable=HOST:PATTERN`; for PyPI, files.pythonhosted.org and the paths of
its files, /packages/xx/yy/<hash>/<name>): a file whose URL names its content never changes, and
PyPI says so (`Cache-Control: immutable`), which lets pip keep it in its cache. A
TLS-intercepting network proxy can strip that header, and then every setup downloads every wheel
again. For these hosts only, once `--authority` has made this proxy's certificate authority (a
CA name-constrained to those hosts' names and to no IP address, whose key never leaves this
container's /tmp, and which only the setup container is given) and `--enable` has turned it on,
a CONNECT is answered by the proxy itself over TLS. Each GET or HEAD request is sent on to the
host over a TLS connection of its own, verified against the host's CA bundle (the one setup
would have used); its answer comes back by its Content-Length and no further, with
`Cache-Control` restored where it is missing on a 200 for a path PATTERN matches whole. Requests
with a body, and other methods, are refused; an answer framed otherwise ends the connection.
Needs Python 3.11; without the authority, or on an older Python, these hosts are tunnelled like
any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import tempfile
from typing import Union

# Never connected to: this host, private, shared (CGNAT), loopback, link-local (cloud
# metadata), IETF protocol assignments, documentation (TEST-NET-1 to 3, 2001:db8::/32: not
# routed, so what answers there is on the local network), benchmarking, multicast and reserved
# ranges; IPv6's own and those that embed or translate IPv4 (IPv4-compatible, NAT64, 6to4,
# Teredo).
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
BLOCKED: list[Network] = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
    "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    "::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23",
    "2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8")]
# Never lifted by --allow: loopback, link-local (cloud metadata), unspecified, multicast.
NEVER: list[Network] = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32",
    "::/128", "::1/128", "fe80::/10", "ff00::/8")]
ALLOWED: list[Network] = []  # --allow=NET
# The engine host's own addresses (--block=ADDR, and this container's gateways and addresses)
EXTRA_BLOCKED: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT = 30.0
IDLE_TIMEOUT = 60.0
BODY_LIMIT = 64 * 1024 * 1024
CONNECT_TIMEOUT = 20.0
MAX_CLIENTS = 128
EVICT_IDLE = 5.0
IMMUTABLE: dict[str, re.Pattern[str]] = {}  # --immutable=HOST:PATTERN: its files' paths
AUTHORITY = os.path.join(tempfile.gettempdir(), "retcon-authority")  # in the container: tmpfs
CACHE_CONTROL = b"Cache-Control: max-age=365000000, immutable"  # what PyPI says of its files
BUNDLE_LIMIT = 16 * 1024 * 1024
# The CA's name constraints exclude every IP address (a constraint on names alone leaves them)
NO_ADDRESS = ("excluded;IP:0.0.0.0/0.0.0.0", "excluded;IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0")


def blocked(address: str) -> bool:
    """Whether an address is in a BLOCKED range, or is an IPv6 address embedding an IPv4 one
    (mapped, 6to4, Teredo) that is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None and blocked(str(embedded)):
            return True
    if ip in EXTRA_BLOCKED or _in(ip, NEVER):
        return True
    if _in(ip, ALLOWED):
        return False
    return _in(ip, BLOCKED)


def _in(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
        networks: list[Network]) -> bool:
    return any(ip in network for network in networks if network.version == ip.version)


def own_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """This container's gateways (/proc/net/route: the engine host's side of its network)
    and its own interface addresses."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    with contextlib.suppress(OSError, ValueError), open("/proc/net/route") as handle:
        for line in handle.read().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 2 and fields[2] != "00000000":
                found.add(ipaddress.IPv4Address(bytes.fromhex(fields[2])[::-1]))
    with contextlib.suppress(OSError):
        with open("/proc/net/fib_trie") as handle:
            lines = handle.read().splitlines()
        for previous, line in zip(lines, lines[1:]):
            if line.strip() == "/32 host LOCAL":
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.ip_address(previous.split()[-1]))
    return found


def host_addresses(args: list[str]
                   ) -> tuple[set[ipaddress.IPv4Address | ipaddress.IPv6Address], list[str]]:
    """(`--block=ADDR` addresses, the registries) from the command line; `--allow=NET`
    networks go to ALLOWED."""
    blocked_here: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    hosts: list[str] = []
    for arg in args:
        if arg.startswith("--block="):
            with contextlib.suppress(ValueError):
                blocked_here.add(ipaddress.ip_address(arg[len("--block="):].split("%", 1)[0]))
        elif arg.startswith("--allow="):
            with contextlib.suppress(ValueError):
                ALLOWED.append(ipaddress.ip_network(arg[len("--allow="):], strict=False))
        elif arg.startswith("--immutable="):
            host, _, pattern = arg[len("--immutable="):].partition(":")
            with contextlib.suppress(re.error):
                IMMUTABLE[host.lower()] = re.compile(pattern)
        else:
            hosts.append(arg.lower())
    return blocked_here, hosts


def authority(hosts: list[str], bundle: bytes, folder: str = AUTHORITY) -> bytes:
    """Make this proxy's certificate authority in `folder` (mode 0700): a CA that may sign for
    `hosts` only (nameConstraints: their names, no IP address), valid two days, and with it a
    certificate for those hosts, kept as `leaf.new` until `enable`; `bundle` (the host's CA
    bundle) is kept beside them to verify the hosts with, and must load. The CA's certificate
    (PEM), which setup is given to trust; its key never leaves `folder`."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    ca, leaf = os.path.join(folder, "ca"), os.path.join(folder, "leaf")
    with open(os.path.join(folder, "upstream.pem"), "wb") as handle:
        handle.write(bundle)
    names = ",".join(f"DNS:{h}" for h in hosts)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    with open(os.path.join(folder, "leaf.ext"), "w") as handle:
        handle.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                     "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\n"
                     f"authorityKeyIdentifier=keyid\nsubjectAltName={names}\n")
    for argv in (
            ["req", "-x509", *key, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
             "-subj", "/CN=retcon-sandbox setup proxy",
             "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "nameConstraints=critical," + ",".join(
                 [*(f"permitted;DNS:{h}" for h in hosts), *NO_ADDRESS])],
            ["req", "-new", *key, "-keyout", leaf + ".key", "-out", leaf + ".csr",
             "-subj", "/CN=" + hosts[0]],
            ["x509", "-req", "-in", leaf + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
             "-set_serial", "0x" + secrets.token_hex(16), "-days", "2", "-out",
             leaf + ".new", "-extfile", os.path.join(folder, "leaf.ext")]):
        subprocess.run(["openssl", *argv], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    _contexts(folder, leaf + ".new")  # ssl.SSLError if a file, or the bundle, will not load
    with open(ca + ".pem", "rb") as handle:
        return handle.read()


def enable(folder: str = AUTHORITY) -> None:
    """Turn the authority on (`_contexts` waits for leaf.pem): once the host has taken the CA
    into setup's bundle, never before, so that setup is never answered with a CA it lacks."""
    os.replace(os.path.join(folder, "leaf.new"), os.path.join(folder, "leaf.pem"))


def _contexts(folder: str = AUTHORITY, leaf: str = ""
              ) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """(the context clients of an immutable host are served with, the one the host is
    verified with), once `enable` has turned them on (or from `leaf`); else None."""
    leaf = leaf or os.path.join(folder, "leaf.pem")
    if not os.path.exists(leaf):
        return None
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(leaf, os.path.join(folder, "leaf.key"))
    serving.set_alpn_protocols(["http/1.1"])
    upstream = ssl.create_default_context(cafile=os.path.join(folder, "upstream.pem"))
    upstream.set_alpn_protocols(["http/1.1"])
    return serving, upstream


def allowed_host(host: str, allowed: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for entry in allowed:
        if entry.startswith("."):
            if host.endswith(entry) or host == entry[1:]:
                return True
        elif host == entry:
            return True
    return False


def split_host_port(text: str, default: int) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `host`; Refused if the port is not a number."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else str(default)
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = text, str(default)
    if not re.fullmatch(r"[0-9]{1,5}", port):
        raise Refused(f"bad port in {text[:80]!r}")
    return host, int(port)


class Refused(Exception):
    pass


async def resolve(host: str, port: int, allowed: list[str]) -> str:
    """The address to connect to: only for an allowed registry, and only when no address the
    name has is blocked."""
    try:
        ipaddress.ip_address(host)
        raise Refused(f"{host} is an address, not a registry's name")
    except ValueError:
        pass
    if not allowed_host(host, allowed):
        raise Refused(f"{host} is not an allowed registry")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                              type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        raise Refused(f"{host[:80]} does not resolve ({exc})") from None
    addresses = [str(info[4][0]) for info in infos]
    bad = [a for a in addresses if blocked(a)]
    if bad or not addresses:
        raise Refused(f"{host} resolves to a private or reserved address ({', '.join(bad)})")
    return addresses[0]


class Activity:
    """When a tunnel last carried a byte, either way; `idle` closes it."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self.last = asyncio.get_running_loop().time()
        self.writers: list[asyncio.StreamWriter] = []

    def touch(self) -> None:
        self.last = asyncio.get_running_loop().time()

    def expired(self) -> bool:
        return asyncio.get_running_loop().time() - self.last >= self.idle

    def close(self) -> None:
        for writer in self.writers:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               activity: Activity | None = None, counted: list[int] | None = None,
               close: bool = True) -> None:
    """Copy until end of stream; with `activity`, until both ways are idle too long.
    `counted[0]` adds up the bytes copied. `close`: close `writer` at the end."""
    try:
        while True:
            if activity is None:
                data = await reader.read(1 << 16)
            else:
                try:
                    data = await asyncio.wait_for(reader.read(1 << 16), activity.idle / 4)
                except asyncio.TimeoutError:
                    if activity.expired():
                        log("closed an idle tunnel")
                        activity.close()
                        break
                    continue
                activity.touch()
            if not data:
                break
            if counted is not None:
                counted[0] += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if close:
            with contextlib.suppress(OSError):
                writer.close()


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
            ConnectionError):
        return None


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def refuse(writer: asyncio.StreamWriter, why: str, status: str = "403 Forbidden") -> None:
    body = f"retcon-sandbox setup: refused: {why}\n".encode()
    writer.write(f"HTTP/1.1 {status}\r\n".encode() + b"Content-Type: text/plain\r\n"
                 b"Connection: close\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode()
                 + body)


_LONE_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # tab is allowed in header values
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+:")  # a token, then the colon: no folding


def request_lines(head: bytes) -> tuple[list[str], list[str]]:
    """An HTTP/1 request head's (request line's three parts, header lines), or Refused."""
    text = head.decode("latin-1")
    if not text.endswith("\r\n\r\n") or _LONE_CONTROL.search(text[:-4].replace("\r\n", "")):
        raise Refused("a request head with a control character or a bare CR or LF")
    lines = text[:-4].split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise Refused("not an HTTP/1 proxy request")
    if any(not _HEADER.match(line) for line in lines[1:]):
        raise Refused("a malformed or folded header line")
    return parts, lines[1:]


def parse(head: bytes) -> tuple[str, str, int, bytes]:
    """A proxy request's (method, host, port, bytes to send upstream first), or Refused.
    CONNECT goes to port 443 only, plain HTTP to port 80 only, with its Host header set to the
    URL's host (never the client's), and hop-by-hop headers dropped."""
    parts, header_lines = request_lines(head)
    lines = ["", *header_lines]
    method, target, version = parts
    if method == "CONNECT":
        host, port = split_host_port(target, 443)
        if port != 443:
            raise Refused(f"CONNECT to port {port} (only 443)")
        return method, host, port, b""
    if not target.startswith("http://"):
        raise Refused(f"{method} {target[:80]} (only CONNECT and http:// URLs)")
    authority, _, path = target[len("http://"):].partition("/")
    host, port = split_host_port(authority, 80)
    if port != 80:
        raise Refused(f"plain HTTP to port {port} (only 80)")
    if any(h.lower().startswith(("transfer-encoding:", "te:", "upgrade:", "expect:"))
           for h in lines[1:]):
        raise Refused("plain HTTP with Transfer-Encoding, TE, Upgrade or Expect (one request "
                      "with a Content-Length body at most)")
    lengths = [h.split(":", 1)[1].strip() for h in lines[1:]
               if h.lower().startswith("content-length:")]
    if len(lengths) > 1 or (lengths and not re.fullmatch(r"[0-9]{1,12}", lengths[0])):
        raise Refused("plain HTTP with a bad or repeated Content-Length")
    headers = [h for h in lines[1:] if not h.lower().startswith(
        ("host:", "proxy-", "connection:", "keep-alive:"))]
    upstream = "\r\n".join([f"{method} /{path} {version}", f"Host: {host}", *headers,
                             "Connection: close", "", ""])
    return method, host, port, upstream.encode("latin-1")


_HOP = ("host:", "proxy-", "connection:", "keep-alive:", "te:", "upgrade:")


def origin_request(head: bytes, host: str) -> tuple[str, str, bytes, bool]:
    """A request inside an immutable host's TLS: (method, path, the head to send the host,
    whether the client's connection ends after it). GET and HEAD only, with no body; the Host
    header is the host's, hop-by-hop headers are dropped, and the host is asked to close."""
    (method, path, version), headers = request_lines(head)
    if method not in ("GET", "HEAD") or not path.startswith("/"):
        raise Refused(f"{method} {path[:80]} (only GET and HEAD of a path)")
    lowered = [h.lower().replace(" ", "").replace("\t", "") for h in headers]
    if any(h.startswith(("transfer-encoding:", "expect:")) or
           (h.startswith("content-length:") and h != "content-length:0") for h in lowered):
        raise Refused("a request with a body")
    close = version == "HTTP/1.0" or "connection:close" in lowered
    kept = [h for h in headers if not h.lower().startswith(_HOP)]
    upstream = "\r\n".join([f"{method} {path} HTTP/1.1", f"Host: {host}", *kept,
                             "Connection: close", "", ""])
    return method, path, upstream.encode("latin-1"), close


def response_head(head: bytes, method: str, immutable: bool) -> tuple[bytes, int | None]:
    """An answer's head as the client gets it, and the length of its body when it is framed
    by one (0 for HEAD, 204 and 304), so that the client's connection can carry another
    request; None when it is not (chunks, or until the end), and then the connection ends
    after it. Hop-by-hop headers are dropped; `immutable` (a 200 for one of the host's files)
    restores CACHE_CONTROL where the answer has no Cache-Control at all (one it has is
    kept)."""
    lines = head[:-4].split(b"\r\n")
    status = lines[0].split(b" ")
    if len(status) < 2 or status[0] not in (b"HTTP/1.0", b"HTTP/1.1") or \
            not re.fullmatch(rb"[0-9]{3}", status[1]) or b"\n" in head[:-4].replace(b"\r\n", b""):
        raise Refused("the host's answer is not HTTP/1")
    code = int(status[1])
    kept = [h for h in lines[1:] if not h.lower().startswith(
        (b"connection:", b"keep-alive:", b"proxy-"))]
    names = [h.split(b":", 1)[0].strip().lower() for h in kept]
    lengths = [h.split(b":", 1)[1].strip() for h in kept
               if h.split(b":", 1)[0].strip().lower() == b"content-length"]
    length: int | None = None
    if method == "HEAD" or code in (204, 304):
        length = 0
    elif code >= 200 and b"transfer-encoding" not in names and len(lengths) == 1 and \
            re.fullmatch(rb"[0-9]{1,15}", lengths[0]):
        length = int(lengths[0])
    if immutable and code == 200 and b"cache-control" not in names:
        kept.append(CACHE_CONTROL)
    if length is None:
        kept.append(b"Connection: close")
    return b"\r\n".join([lines[0], *kept, b"", b""]), length


_CONTEXTS: list[tuple[ssl.SSLContext, ssl.SSLContext] | None] = []


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """`_contexts`, read once they exist; None, said once, if they will not load (the
    immutable hosts are tunnelled then)."""
    if not _CONTEXTS and sys.version_info >= (3, 11):
        try:
            made = _contexts()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log(f"tunnelling every host: the authority will not load ({exc})")
            made = None
            _CONTEXTS.append(None)
        if made is not None:
            _CONTEXTS.append(made)
    return _CONTEXTS[0] if _CONTEXTS else None


async def intercept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                    address: str, activity: Activity,
                    made: tuple[ssl.SSLContext, ssl.SSLContext], port: int = 443) -> None:
    """A CONNECT to an immutable host, answered over TLS by this proxy: each request is sent
    on to the host (`exchange`) until the client or an unframed answer ends the connection."""
    serving, upstream = made
    down, answered = [0], 0
    if len(getattr(reader, "_buffer", b"")):  # sent before the answer: not inside the TLS
        log(f"refused CONNECT {host}:443: bytes came before its answer")
        refuse(writer, "bytes came before the CONNECT's answer")
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    try:
        await writer.drain()
        await asyncio.wait_for(writer.start_tls(serving), HEAD_TIMEOUT)
        while True:
            head = await read_head(reader)
            if head is None:
                break
            activity.touch()
            try:
                method, path, request, close = origin_request(head, host)
            except Refused as exc:
                log(f"refused a request to {host}: {exc}")
                refuse(writer, str(exc))
                await writer.drain()
                break
            answered += 1
            if not await exchange(writer, (host, address, port), upstream,
                                  (method, path, request), activity, down) or close:
                break
    except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
        log(f"the client's TLS with {host} ended: {type(exc).__name__}")
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()
    log(f"closed {host}:443 up 0 down {down[0]} ({answered} requests answered here)")


async def exchange(writer: asyncio.StreamWriter, to: tuple[str, str, int],
                   upstream: ssl.SSLContext, request: tuple[str, str, bytes],
                   activity: Activity, down: list[int]) -> bool:
    """`request` (method, path, head) sent to `to` (host, its address, port) over a TLS
    connection of its own, verified with `upstream`; its answer copied back
    (`response_head`), counted in `down[0]`. Whether the client's connection can carry
    another request."""
    host, address, port = to
    method, path, head = request
    up_writer = None
    try:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
            address, port, ssl=upstream, server_hostname=host, limit=HEAD_LIMIT),
            CONNECT_TIMEOUT)
        up_writer.write(head)
        answer = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        down[0] += len(answer)
        rewritten, length = response_head(answer, method,
                                          bool(IMMUTABLE[host].fullmatch(path)))
    except (Refused, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            asyncio.TimeoutError) as exc:  # ssl.SSLError (a certificate refused) is an OSError
        log(f"refused {method} https://{host}{path[:80]}: {exc or 'no answer in time'}")
        refuse(writer, f"{host} gave no answer ({exc or 'timeout'})", "502 Bad Gateway")
        await writer.drain()
        if up_writer is not None:
            up_writer.close()
        return False
    writer.write(rewritten)
    if length is None:
        await pipe(up_reader, writer, activity, down, close=False)
        whole = False
    else:
        whole = await copy_exactly(up_reader, writer, length, activity, down)
    with contextlib.suppress(OSError):
        up_writer.close()
    return whole


async def copy_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int,
                       activity: Activity | None = None, down: list[int] | None = None) -> bool:
    """`length` bytes, no more: whether they all came within IDLE_TIMEOUT of each other (what
    is sent beyond them is never read). `down[0]` adds them up."""
    try:
        while length > 0:
            data = await asyncio.wait_for(reader.read(min(length, 1 << 16)), IDLE_TIMEOUT)
            if not data:
                return False
            if activity is not None:
                activity.touch()
            length -= len(data)
            if down is not None:
                down[0] += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, asyncio.TimeoutError):
        return False
    return True


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                allowed: list[str], activity: Activity | None = None) -> None:
    """One client's request; `activity`: the client's, which `Clients` watches."""
    activity = activity or Activity(IDLE_TIMEOUT)
    head = await read_head(reader)
    if head is None:
        writer.close()
        return
    activity.touch()
    first = head.split(b"\r\n", 1)[0].decode("latin-1")[:200]
    try:
        method, host, port, rest = parse(head)
        address = await resolve(host, port, allowed)
        name = host.lower().rstrip(".")
        made = contexts() if method == "CONNECT" and name in IMMUTABLE else None
        if made is not None:
            log(f"allowed {method} {name}:{port}, answered here")
            await intercept(reader, writer, name, address, activity, made)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            raise Refused(f"{host}:{port} did not answer ({exc or 'timeout'})") from None
    except Refused as exc:
        log(f"refused {first}: {exc}")
        refuse(writer, str(exc))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        return
    log(f"allowed {method} {host}:{port}")
    if method == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        activity.writers = [writer, up_writer]
        up, down = [0], [0]
        await asyncio.gather(pipe(reader, up_writer, activity, up),
                             pipe(up_reader, writer, activity, down))
        log(f"closed {host}:{port} up {up[0]} down {down[0]}")
        return
    down = [0]
    await one_request(reader, writer, up_reader, up_writer, rest, activity, down)
    log(f"closed {host}:{port} up 0 down {down[0]}")


async def one_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter,
                      head: bytes, activity: Activity | None = None,
                      down: list[int] | None = None) -> None:
    """Plain HTTP: the head, then the body its Content-Length declares, and nothing more
    from the client; the response until the upstream closes (the head asked it to); then
    both connections close. Bytes pipelined after the request are never forwarded."""
    match = re.search(rb"\r\ncontent-length:\s*([0-9]+)", head, re.IGNORECASE)
    length = int(match.group(1)) if match else 0
    within = length <= BODY_LIMIT
    if within:
        up_writer.write(head)
    if not within or not await copy_exactly(reader, up_writer, length, activity):
        for each in (up_writer, writer):  # over the limit, or the client's body fell short
            with contextlib.suppress(OSError):
                each.close()
        return
    activity = activity or Activity(IDLE_TIMEOUT)
    activity.writers = [writer, up_writer]
    await pipe(up_reader, writer, activity, down)
    with contextlib.suppress(OSError):
        up_writer.close()


class Clients:
    """The connections served at once, each with its Activity: at most `limit`. When all are
    taken, a new client takes the place of the one idle longest, if no byte went either way on
    it for `evict_idle` seconds (a tunnel left open, a head that never came); else it is
    refused: every one is busy."""

    def __init__(self, limit: int, evict_idle: float) -> None:
        self.limit = limit
        self.evict_idle = evict_idle
        self.open: set[Activity] = set()

    def admit(self, activity: Activity) -> bool:
        if len(self.open) >= self.limit:
            idlest = min(self.open, key=lambda a: a.last)
            idle = asyncio.get_running_loop().time() - idlest.last
            if idle < self.evict_idle:
                return False
            log(f"closed a connection idle for {idle:.0f} s: {self.limit} were open")
            self.open.discard(idlest)
            idlest.close()
        self.open.add(activity)
        return True

    def leave(self, activity: Activity) -> None:
        self.open.discard(activity)


async def main(port: int, allowed: list[str], limit: int = MAX_CLIENTS,
               ready: asyncio.Future[int] | None = None) -> None:
    """Serve on `port` (0: any; its number is set on `ready`) until cancelled."""
    clients = Clients(limit, EVICT_IDLE)

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        activity = Activity(IDLE_TIMEOUT)
        activity.writers = [writer]
        if not clients.admit(activity):
            log(f"refused a connection: {limit} already open, none idle")
            writer.close()
            return
        try:
            await serve(reader, writer, allowed, activity)
        except (ConnectionError, OSError):
            writer.close()
        except Exception as exc:  # one bad request never stops the proxy: logged, closed
            log(f"error: {type(exc).__name__}: {str(exc)[:200]}")
            writer.close()
        finally:
            clients.leave(activity)

    server = await asyncio.start_server(client, "0.0.0.0", port, limit=HEAD_LIMIT)
    port = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(port)
    log(f"listening on {port} for: {' '.join(allowed)}")
    async with server:
        await server.serve_forever()


def make_authority(hosts: list[str]) -> None:
    """`--authority HOST...`: the host's CA bundle on stdin (its length in bytes on the first
    line, then the bytes), our CA's certificate on stdout."""
    size = sys.stdin.buffer.readline().strip()
    if not size.isdigit() or int(size) > BUNDLE_LIMIT:
        sys.exit("--authority: the CA bundle's length, then the bundle, on stdin")
    bundle = sys.stdin.buffer.read(int(size))
    try:
        certificate = authority(hosts, bundle)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        said = getattr(exc, "stderr", b"") or b""
        sys.exit(f"--authority: {exc} {said.decode(errors='replace')[-300:]}")
    sys.stdout.buffer.write(certificate)


if __name__ == "__main__" and sys.argv[1:2] == ["--authority"]:
    make_authority(sys.argv[2:])
elif __name__ == "__main__" and sys.argv[1:] == ["--enable"]:
    enable()
elif __name__ == "__main__":
    extra, hosts = host_addresses(sys.argv[2:])
    EXTRA_BLOCKED.update(extra | own_addresses())
    asyncio.run(main(int(sys.argv[1]), hosts))
