"""The user's key: what authenticates the results this user's runs record (the verification
cache's notes) and salts what must not be readable from them (the `--pass-env` values).

It is kept outside every repository, so nothing a branch, a spec or a fetched notes ref brings
can forge it. By default it is `$XDG_STATE_HOME/retcon-sandbox/notes.key` (XDG_STATE_HOME
defaults to ~/.local/state): 32 random bytes, made on first use, atomically, mode 0600. A key
file that is a symbolic link, not a regular file, not the user's own, or readable or writable by
anyone else is refused, never used or replaced. A CI job that shares results with other jobs
gives the secret itself in RETCON_SANDBOX_NOTES_KEY (at least 32 characters; an empty value
counts as unset).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from retcon_sandbox.errors import ConfigError, log_dir

ENV = "RETCON_SANDBOX_NOTES_KEY"
FILE_NAME = "notes.key"
MIN_SECRET = 32  # characters of RETCON_SANDBOX_NOTES_KEY
KEY_BYTES = 32


@dataclass(frozen=True)
class UserKey:
    secret: bytes
    origin: str  # where it came from, for messages

    def mac(self, data: bytes) -> str:
        return hmac.new(self.secret, data, hashlib.sha256).hexdigest()

    def verify(self, data: bytes, mac: str) -> bool:
        return hmac.compare_digest(self.mac(data), mac)

    def digest(self, purpose: str, value: object) -> str:
        """A keyed digest of `value` (JSON-able): equal values give equal digests under one key,
        and nobody without the key can tell which value it was."""
        text = json.dumps([purpose, value], sort_keys=True, ensure_ascii=True)
        return self.mac(text.encode())[:32]


_loaded: dict[tuple[str, str], UserKey] = {}


def key_path() -> Path:
    return log_dir() / FILE_NAME


def load() -> UserKey:
    """The key in use: RETCON_SANDBOX_NOTES_KEY, else the key file (made if missing)."""
    secret = os.environ.get(ENV, "")
    path = key_path()
    cached = _loaded.get((secret, str(path)))
    if cached is not None:
        return cached
    key = _from_environment(secret) if secret else UserKey(_read(path) or _create(path),
                                                           str(path))
    _loaded[(secret, str(path))] = key
    return key


def _from_environment(secret: str) -> UserKey:
    if len(secret.strip()) < MIN_SECRET:
        raise ConfigError(f"{ENV} is too short to be a key ({len(secret.strip())} characters; "
                          f"at least {MIN_SECRET} are needed)",
                          "Give it a random secret, for example the output of "
                          "`openssl rand -hex 32`, from your CI's secret store.")
    # the bytes as given: a secret need not be UTF-8 (surrogateescape carries the others)
    return UserKey(os.fsencode(secret.strip()), f"${ENV}")


def _refused(path: Path, why: str) -> ConfigError:
    return ConfigError(f"the notes key {path} {why}; it is not used",
                       "It authenticates the verification cache and must be yours alone: "
                       f"remove it (`rm {path}`) so that a new one is made, or fix it "
                       f"(`chmod 600 {path}`), or give the key in {ENV}.")


def _read(path: Path) -> bytes | None:
    """The key in `path`, None if there is none; refused when anyone else could know it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(path, "is a symbolic link") from None
        raise _refused(path, f"cannot be read ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _refused(path, "is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_uid != os.geteuid():
            raise _refused(path, f"belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise _refused(path, f"is readable or writable by others (mode "
                           f"{stat.S_IMODE(info.st_mode):o})")
        data = handle.read(1024).strip()
    try:
        secret = bytes.fromhex(data.decode("ascii"))
    except ValueError:
        secret = b""
    if len(secret) != KEY_BYTES:
        raise _refused(path, f"is not a key ({KEY_BYTES * 2} hexadecimal digits)")
    return secret


def _create(path: Path) -> bytes:
    """A new key, written to a private file of its own and linked into place, so that nobody
    ever reads a half-written key and two runs starting at once agree on one."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.stat(directory)
    except OSError as exc:
        raise ConfigError(f"cannot make {directory} for the notes key ({exc.strerror})",
                          f"Make it writable, set XDG_STATE_HOME, or give the key in {ENV}."
                          ) from None
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ConfigError(f"{directory} is not a private directory of yours; the notes key is "
                          "not made there", f"`chmod 700 {directory}`, set XDG_STATE_HOME, or "
                          f"give the key in {ENV}.")
    temporary = directory / f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(8)}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_hex(KEY_BYTES).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another run made it first: use theirs
            os.link(temporary, path)
    except OSError as exc:
        raise ConfigError(f"cannot write the notes key {path} ({exc.strerror})",
                          f"Make {directory} writable, set XDG_STATE_HOME, or give the key in "
                          f"{ENV}.") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    key = _read(path)
    if key is None:
        raise ConfigError(f"the notes key {path} vanished as it was made",
                          "Rerun; if it happens again, something else removes it.")
    return key
