"""retcon-sandbox's egress proxy for `[sandbox] setup`. Standard library only; Python 3.8+.

Started in a container of its own (`python3 -I -c <this file> PORT HOST...`) that sits on two
networks: an internal one, where the setup container is and which has no other way out, and an
ordinary one. It answers HTTP proxy requests (CONNECT for HTTPS, absolute URIs for plain HTTP)
for the registries named on its command line only (`pypi.org`, or `.debian.org` for every host
under it), on ports 80 and 443, and never for an address that is loopback, private, link-local
(169.254.169.254, cloud metadata), shared, multicast or reserved: it resolves the name itself,
checks every address, and connects to the address it checked. TLS passes through untouched.
Each decision is one line on stderr, which the host reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys

PORTS = (80, 443)
BLOCKED = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
    "240.0.0.0/4", "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
    "64:ff9b::/96", "2001:db8::/32")]
HEAD_LIMIT = 64 * 1024
CONNECT_TIMEOUT = 20.0


def blocked(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in BLOCKED if network.version == ip.version)


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
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return text, default
    return host, int(port)


class Refused(Exception):
    pass


async def resolve(host: str, port: int, allowed: list[str]) -> str:
    """The address to connect to: only for an allowed registry and port, and only when every
    address the name has is public."""
    try:
        ipaddress.ip_address(host)
        raise Refused(f"{host} is an address, not a registry's name")
    except ValueError:
        pass
    if not allowed_host(host, allowed):
        raise Refused(f"{host} is not an allowed registry")
    if port not in PORTS:
        raise Refused(f"port {port} (only 80 and 443)")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                              type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise Refused(f"{host} does not resolve ({exc})") from None
    addresses = [str(info[4][0]) for info in infos]
    bad = [a for a in addresses if blocked(a)]
    if bad or not addresses:
        raise Refused(f"{host} resolves to a private or reserved address ({', '.join(bad)})")
    return addresses[0]


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def refuse(writer: asyncio.StreamWriter, why: str) -> None:
    body = f"retcon-sandbox setup: refused: {why}\n".encode()
    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                allowed: list[str]) -> None:
    head = await read_head(reader)
    if head is None:
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    try:
        if len(parts) != 3:
            raise Refused("not an HTTP proxy request")
        method, target, version = parts
        if method == "CONNECT":
            host, port = split_host_port(target, 443)
            rest = b""
        elif target.startswith("http://"):
            authority, _, path = target[len("http://"):].partition("/")
            host, port = split_host_port(authority, 80)
            headers = [h for h in lines[1:] if h and not h.lower().startswith(
                ("proxy-", "connection:", "keep-alive:"))]
            rest = "\r\n".join([f"{method} /{path} {version}", *headers, "Connection: close",
                                "", ""]).encode("latin-1")
        else:
            raise Refused(f"{method} {target[:80]} (only CONNECT and http:// URLs)")
        address = await resolve(host, port, allowed)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            raise Refused(f"{host}:{port} did not answer ({exc or 'timeout'})") from None
    except Refused as exc:
        log(f"refused {lines[0][:200]}: {exc}")
        refuse(writer, str(exc))
        await writer.drain()
        writer.close()
        return
    log(f"allowed {method} {host}:{port}")
    if method == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
    else:
        up_writer.write(rest)
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def main(port: int, allowed: list[str]) -> None:
    server = await asyncio.start_server(lambda r, w: serve(r, w, allowed), "0.0.0.0", port,
                                        limit=HEAD_LIMIT)
    log(f"listening on {port} for: {' '.join(allowed)}")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), [h.lower() for h in sys.argv[2:]]))
