"""retcon-sandbox's egress proxy for `[sandbox] setup`. Standard library only; Python 3.8+.

Started in a container of its own (`python3 -I -S -c <this file> PORT HOST...`) that sits on two
networks: an internal one, where the setup container is and which has no other way out, and an
ordinary one. It answers HTTP proxy requests (CONNECT for HTTPS, absolute URIs for plain HTTP)
for the registries named on its command line only (`pypi.org`, or `.debian.org` for every host
under it): CONNECT to port 443, plain HTTP to port 80 with the Host header set to the URL's
host. It never connects to a loopback, private, link-local (169.254.169.254, cloud metadata),
shared, multicast or reserved address, nor an IPv6 address embedding one (BLOCKED): it resolves
the name itself, checks every address, and connects to the address it checked. TLS passes
through untouched. A request head must arrive within HEAD_TIMEOUT seconds, and at most
MAX_CLIENTS connections are served at once: when all are taken, the one idle longest (no byte
either way for EVICT_IDLE seconds at least) is closed for a new client, so idle tunnels cannot
lock others out. Each decision is one line on stderr, which the host reads, and so is each
connection's end, with the bytes it carried each way (`closed HOST:PORT up N down M`: what setup
downloaded).

The engine host's own addresses are refused too, whatever range they are in: those the host
names (`--block=ADDR`: every network's gateway and, for a local engine, its interfaces), and
this container's gateways and own addresses. `--allow=NET` (the user's --setup-allow-address)
lifts the block of a documentation, private or reserved range for the addresses in NET, never
for loopback, link-local, unspecified or multicast ones (NEVER) nor the host's.

A plain HTTP connection carries one request and its response, then closes (a second, pipelined
request never reaches the upstream, which may serve other hosts); a request body is forwarded by
its Content-Length only. A tunnel (CONNECT) idle in both directions for IDLE_TIMEOUT seconds is
closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
import sys
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
        else:
            hosts.append(arg.lower())
    return blocked_here, hosts


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
               activity: Activity | None = None, counted: list[int] | None = None) -> None:
    """Copy until end of stream; with `activity`, until both ways are idle too long.
    `counted[0]` adds up the bytes copied."""
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


def refuse(writer: asyncio.StreamWriter, why: str) -> None:
    body = f"retcon-sandbox setup: refused: {why}\n".encode()
    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


_LONE_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # tab is allowed in header values
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+:")  # a token, then the colon: no folding


def parse(head: bytes) -> tuple[str, str, int, bytes]:
    """A proxy request's (method, host, port, bytes to send upstream first), or Refused.
    CONNECT goes to port 443 only, plain HTTP to port 80 only, with its Host header set to the
    URL's host (never the client's), and hop-by-hop headers dropped."""
    text = head.decode("latin-1")
    if not text.endswith("\r\n\r\n") or _LONE_CONTROL.search(text[:-4].replace("\r\n", "")):
        raise Refused("a request head with a control character or a bare CR or LF")
    lines = text[:-4].split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise Refused("not an HTTP/1 proxy request")
    if any(not _HEADER.match(line) for line in lines[1:]):
        raise Refused("a malformed or folded header line")
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
    try:
        if length > BODY_LIMIT:
            raise ConnectionError("request body over the limit")
        up_writer.write(head)
        while length > 0:
            data = await asyncio.wait_for(reader.read(min(length, 1 << 16)), IDLE_TIMEOUT)
            if not data:
                raise ConnectionError("the client closed before its body ended")
            length -= len(data)
            if activity is not None:
                activity.touch()
            up_writer.write(data)
            await up_writer.drain()
    except (ConnectionError, OSError, asyncio.TimeoutError):
        for each in (up_writer, writer):
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


if __name__ == "__main__":
    extra, hosts = host_addresses(sys.argv[2:])
    EXTRA_BLOCKED.update(extra | own_addresses())
    asyncio.run(main(int(sys.argv[1]), hosts))
