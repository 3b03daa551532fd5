"""What the command line, and only the command line, lets into a sandbox from the host: named
environment variables (`--pass-env NAME`), image pulls (`--allow-pull`), and what `[sandbox]
setup` may reach (`--setup-network`, `--setup-registry`). A spec cannot widen any of them: it
may come from someone else.

`--setup-allow-address NET` lets setup's egress proxy connect to addresses it otherwise refuses
(a documentation, private or reserved range: a network whose resolver answers with such
addresses, a private mirror), never to loopback, link-local (cloud metadata), unspecified or
multicast ones, nor to the engine host's own.

A variable is refused when its name or its value looks like a credential, whatever it is called:
a key, token or password in the value (`sk-…`, `ghp_…`, `AKIA…`, a private key, a JWT, a URL with
a password) would reach code that is not trusted, and its output reaches the transcript."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections import Counter
from dataclasses import dataclass

from retcon_sandbox.errors import UsageError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|PRIVATE|CREDENTIAL|_AUTH"
                          r"|^AUTH|COOKIE|SESSION|_PAT$|^PAT_", re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"sk-[A-Za-z0-9_-]{16,}"                      # OpenAI and similar API keys
    r"|(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{16,}"                  # GitLab
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"             # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"                 # AWS access key ids
    r"|AIza[0-9A-Za-z_-]{30,}"                    # Google API keys
    r"|npm_[A-Za-z0-9]{30,}"                      # npm tokens
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."  # JWTs
    r"|[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@",  # a URL with a password
    re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")


REGISTRIES = (
    "pypi.org", "files.pythonhosted.org",  # PyPI
    "registry.npmjs.org",  # npm
    "crates.io", "index.crates.io", "static.crates.io",  # the Rust crate registry
    "deb.debian.org", "security.debian.org",  # Debian
)
# Registries whose files are named by their content, and the paths of those files: setup's
# egress proxy restores the Cache-Control they send (which a TLS-intercepting network can
# strip), so that the package cache keeps them (`sandbox/egress.py`).
IMMUTABLE = {"files.pythonhosted.org":
             r"/packages/[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{60}/[A-Za-z0-9][A-Za-z0-9._+!-]*"}
SETUP_NETWORKS = ("registries", "full", "none")
SETUP_DISK = 4 * 1024**3
KEEP_ENVIRONMENTS = 3
CACHE_PATH = "/var/cache/retcon-sandbox"  # the package cache, in setup containers only
_HOST = re.compile(r"\.?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+")

@dataclass(frozen=True)
class SetupPolicy:
    """What setup may reach: from the command line only (a spec cannot widen it)."""

    network: str = "registries"
    extra_registries: tuple[str, ...] = ()
    disk: int = SETUP_DISK  # --setup-disk: the most a setup may write (bytes)
    keep: int = KEEP_ENVIRONMENTS  # --keep-environments: prepared environments per repository
    package_cache: bool = True  # --no-package-cache: setup downloads everything each time
    allowed_addresses: tuple[str, ...] = ()  # --setup-allow-address: networks, normalised

    @property
    def registries(self) -> tuple[str, ...]:
        return REGISTRIES + self.extra_registries


@dataclass(frozen=True)
class HostAccess:
    env: tuple[tuple[str, str], ...] = ()
    allow_pull: bool = False
    setup: SetupPolicy = SetupPolicy()

    @property
    def variables(self) -> dict[str, str]:
        return dict(self.env)


def from_command_line(names: list[str] | None, allow_pull: bool,
                      setup_network: str = "registries",
                      registries: list[str] | None = None, setup_disk: int = SETUP_DISK,
                      keep_environments: int = KEEP_ENVIRONMENTS,
                      package_cache: bool = True,
                      allowed_addresses: list[str] | None = None) -> HostAccess:
    """`--pass-env` names checked against the host's environment, `--setup-registry` names
    checked as host names, `--setup-allow-address` as networks, before anything runs."""
    chosen: dict[str, str] = {}
    for name in names or ():
        chosen[name] = _checked(name)
    hosts = tuple(_host(h) for h in registries or ())
    networks = tuple(_network(n) for n in allowed_addresses or ())
    return HostAccess(tuple(sorted(chosen.items())), allow_pull,
                      SetupPolicy(setup_network, hosts, setup_disk, keep_environments,
                                  package_cache, networks))


def _network(text: str) -> str:
    """An address or a network (`203.0.113.80`, `10.20.0.0/16`) that does not reach loopback,
    link-local, unspecified or multicast addresses (the egress proxy's NEVER)."""
    from retcon_sandbox.sandbox import egress

    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise UsageError(f"--setup-allow-address {text!r}: expected an address or a network, "
                         "such as 203.0.113.80 or 10.20.0.0/16") from None
    never = next((n for n in egress.NEVER if n.version == network.version
                  and network.overlaps(n)), None)
    if never is not None:
        raise UsageError(f"--setup-allow-address {text}: it reaches {never}, which setup's "
                         "egress proxy never connects to (loopback, link-local and cloud "
                         "metadata, unspecified, multicast)",
                         "Name only the addresses the registry resolves to.")
    return str(network)


def _host(text: str) -> str:
    host = text.strip().lower().rstrip(".")
    if not _HOST.fullmatch(host):
        raise UsageError(f"--setup-registry {text!r}: expected a host name such as "
                         "\"pypi.example.com\" (or \".example.com\" for every host under it)")
    return host


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UsageError(f"--pass-env {name!r}: not a variable name",
                         "Give the name only (--pass-env LANG), never NAME=value.")
    if name not in os.environ:
        raise UsageError(f"--pass-env {name}: the variable is not set on this host")
    value = os.environ[name]
    why = credential_problem(name, value)
    if why:
        raise UsageError(f"--pass-env {name}: refused, {why}",
                         "Sandboxed code is untrusted and its output is recorded: pass no "
                         "credentials. Give what the build needs through the spec's setup, or "
                         "a non-secret variable.")
    return value


def credential_problem(name: str, value: str) -> str | None:
    """Why `name=value` looks like a credential, or None."""
    if _SECRET_NAME.search(name):
        return "its name says it holds a credential"
    if _SECRET_VALUE.search(value):
        return "its value looks like a credential (a key, token, private key or password)"
    for token in _TOKEN.findall(value):
        if _entropy(token) > 4.0 and not token.isalpha() and not _looks_like_path(token):
            return "its value holds a long random-looking string, as tokens do"
    return None


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _looks_like_path(token: str) -> bool:
    return "/" in token and all(part.isidentifier() or not part for part in
                                token.replace("-", "_").replace(".", "_").split("/"))
