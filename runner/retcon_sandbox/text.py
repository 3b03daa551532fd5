"""The one sanitiser for human-facing text that may come from an untrusted source: test output,
model summaries, file names, commit subjects, anything read from the spec or the repository.

It escapes, visibly, every C0 and C1 control character except newline and tab (so no escape
sequence, OSC 52 clipboard write, title change or carriage-return overwrite reaches the
terminal), DEL, bidirectional controls and zero-width characters, and bytes that are not UTF-8.
`--json` output is not passed through it: JSON escapes what it must and stays exact.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any
from urllib.parse import urlsplit

_INVISIBLE = (
    "\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
)
_UNSAFE = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_INVISIBLE}\\udc80-\\udcff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return {"\r": "\\r", "\x1b": "\\e"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}"


def sanitize(text: str) -> str:
    return _UNSAFE.sub(_escape, text)


def sanitize_name(name: str) -> str:
    """A file name or other one-line value: newlines and tabs are escaped too."""
    return sanitize(name).replace("\n", "\\n").replace("\t", "\\t")


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])|\\([23][0-7][0-7])")


def escape_undecodable(text: str) -> str:
    """Text that encodes as UTF-8: each byte that was not UTF-8 (a surrogateescape surrogate)
    written `\\xNN`, as `sanitize` shows it; `restore_undecodable` reverses it."""
    return _SURROGATE.sub(_escape, text)


def encodable(value: Any) -> Any:
    """`value` (text, or lists and dicts of it, keys too) with every byte of a name that is not
    UTF-8 written `\\xNN` (`escape_undecodable`): what goes out as UTF-8 JSON (the model's
    requests, `--json`), where a lone surrogate is refused by strict parsers."""
    if isinstance(value, str):
        return escape_undecodable(value)
    if isinstance(value, list | tuple):
        return [encodable(item) for item in value]
    if isinstance(value, dict):
        return {encodable(key): encodable(item) for key, item in value.items()}
    return value


def restore_undecodable(text: str) -> str:
    """`\\xNN` (NN from 80 to ff), or git's quoting `\\NNN` (octal 200 to 377), back to the
    byte it stands for, as surrogateescape carries it."""
    return _ESCAPED_BYTE.sub(_byte, text)


def _byte(match: re.Match[str]) -> str:
    hexa, octal = match.groups()
    return chr(0xDC00 + (int(hexa, 16) if hexa else int(octal, 8)))


def plain_number(value: float) -> str:
    """A number as a person writes it: a whole one in full (`1000000`, never `1e+06`), another
    with the digits it needs (`0.5`, `2.25`)."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value)):
        return str(int(value))
    if not math.isfinite(value):
        return str(value)
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("0", "-0") else f"{value:.3g}"


def indent(text: str, prefix: str) -> str:
    """Every line of `text` after the first, prefixed (for multi-line values in a listing)."""
    return text.replace("\n", "\n" + prefix)


MAX_URL = 2048  # longer is no API's base URL (httpx refuses 64 KiB, servers far less)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be an HTTP(S) endpoint's base URL, or None when it can: what the HTTP
    stack would refuse (or fail on at the first request) is refused here, before anything runs."""
    if not url.strip() or url != url.strip() or any(c.isspace() for c in url):
        return "it is empty or contains spaces"
    if _SURROGATE.search(url):
        return "it contains bytes that are not UTF-8"
    if len(url) > MAX_URL:
        return f"it is {len(url)} characters long (at most {MAX_URL})"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"it is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "it must start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "port 0 is not a port"
    if parts.query or parts.fragment:
        return "it has a query or fragment; give the API's base URL (usually ending in /v1)"
    return _host_problem(parts.netloc.rpartition("@")[2])


def _host_problem(hostport: str) -> str | None:
    """Why the `host[:port]` of a URL names no host a connection can be made to."""
    if hostport.startswith("["):
        address, _, rest = hostport[1:].partition("]")
        if rest and not re.fullmatch(r":[0-9]+", rest):
            return f"{rest!r} after the IPv6 address is not a :port"
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return f"[{address}] is not an IPv6 address"
        return None
    host = hostport.rpartition(":")[0] if ":" in hostport else hostport
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        return f"{host[:80]!r} is not a host name (a label is empty or longer than 63 characters)"
    if len(encoded) > 253:
        return f"the host name is {len(encoded)} characters long (at most 253)"
    return None
