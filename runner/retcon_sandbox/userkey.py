"""The user's key: what authenticates the results this user's runs record (the verification
cache's notes) and salts what must not be readable from them (the `--pass-env` values).

It is kept outside every repository, so nothing a branch, a spec or a fetched notes ref brings
can forge it. By default it is `$XDG_STATE_HOME/retcon-sandbox/notes.key` (XDG_STATE_HOME
defaults to ~/.local/state): 32 random bytes, made on first use, atomically, mode 0600. A key
file that is a symbolic link, a hard link (another name of the same file), not a regular file,
not the user's own, readable or writable by anyone else, or in a folder anyone else can write
(where it could be swapped) is refused, never used or replaced; each refusal says the remedy
that fits it. A CI job that shares results with other jobs gives the secret itself in
RETCON_SANDBOX_NOTES_KEY: at least 32 characters, and not plainly made by hand (`estimated_bits`
at least MIN_BITS: not `aaaa…`); an empty value counts as unset.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import itertools
import json
import math
import os
import secrets
import stat
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from retcon_sandbox.errors import ConfigError, log_dir

ENV = "RETCON_SANDBOX_NOTES_KEY"
FILE_NAME = "notes.key"
MIN_SECRET = 32  # characters of RETCON_SANDBOX_NOTES_KEY
MIN_BITS = 128  # its estimated entropy
KEY_BYTES = 32
MAKE_ONE = "`openssl rand -hex 32`"


@dataclass(frozen=True)
class UserKey:
    secret: bytes
    origin: str  # where it came from, for messages

    def mac(self, data: bytes) -> str:
        return hmac.new(self.secret, data, hashlib.sha256).hexdigest()

    def verify(self, data: bytes, mac: str) -> bool:
        """Whether `mac` is `data`'s HMAC (an untrusted `mac` of any text is just False)."""
        return mac.isascii() and hmac.compare_digest(self.mac(data), mac)

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
    secret = secret.strip()
    if len(secret) < MIN_SECRET:
        raise ConfigError(f"{ENV} is too short to be a key ({len(secret)} characters; "
                          f"at least {MIN_SECRET} are needed)",
                          f"Give it a random secret, for example the output of {MAKE_ONE}, "
                          "from your CI's secret store.")
    bits = estimated_bits(secret)
    if bits < MIN_BITS:
        raise ConfigError(f"{ENV} is plainly not random (about {bits:.0f} bits of entropy "
                          f"estimated in its {len(secret)} characters; at least {MIN_BITS} are "
                          "needed): anyone could guess it and forge your cached results",
                          f"Replace the secret in your CI's secret store with a random one, "
                          f"for example the output of {MAKE_ONE}.")
    # the bytes as given: a secret need not be UTF-8 (surrogateescape carries the others)
    return UserKey(os.fsencode(secret), f"${ENV}")


# Character classes and their sizes, for `estimated_bits` (a class counts whole once used).
_CLASSES = ((set("0123456789abcdef"), 16), (set("0123456789ABCDEF"), 16),
            (set("0123456789"), 10), (set("abcdefghijklmnopqrstuvwxyz"), 26),
            (set("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 26))
_SHOWS = 0.7  # the share of its alphabet's bits a random string's sample shows, at the least


def estimated_bits(secret: str) -> float:
    """A generous estimate of a secret's entropy: its length times the bits per character of
    the alphabet its characters come from (hexadecimal, digits, letters, anything else), cut
    down when its characters, or the steps between neighbours, show far less variety than a
    random string's would (`aaaa`, `abcd…`); a string that repeats a shorter one has that
    one's. A random string of MIN_SECRET hexadecimal digits has MIN_BITS."""
    n = len(secret)
    if n < 2:
        return 0.0
    period = _period(secret)
    if period <= n // 2:  # `password` four times holds no more than `password`
        return estimated_bits(secret[:period])
    per_char = math.log2(_alphabet(secret))
    steps = [ord(b) - ord(a) for a, b in itertools.pairwise(secret)]
    shown = min(_shannon(secret), _shannon(steps))
    expected = min(per_char, math.log2(n))  # the most a sample of n characters can show
    return n * per_char * min(1.0, shown / (_SHOWS * expected))


def _period(text: str) -> int:
    """The length of the shortest string that `text` repeats (the last time perhaps in part):
    the prefix function's, in linear time."""
    border = [0] * len(text)
    for i in range(1, len(text)):
        k = border[i - 1]
        while k and text[i] != text[k]:
            k = border[k - 1]
        border[i] = k + (text[i] == text[k])
    return len(text) - border[-1]


def _alphabet(secret: str) -> int:
    used = set(secret)
    for chars, size in _CLASSES[:2]:
        if used <= chars:
            return size
    size = sum(n for chars, n in _CLASSES[2:] if used & chars)
    others = used - set().union(*(chars for chars, _ in _CLASSES))
    return max(size + (33 if others else 0), 2)  # printable ASCII's other 33, or any bytes


def _shannon(items: Sequence[Hashable]) -> float:
    counts: dict[Hashable, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    total = len(items)
    return -sum(c / total * math.log2(c / total) for c in counts.values())


def _refused(path: Path, why: str, remedy: str) -> ConfigError:
    return ConfigError(f"the notes key {path} {why}; it is not used",
                       f"It authenticates the verification cache and must be yours alone. "
                       f"{remedy} Your earlier results are then run again; or give the key in "
                       f"{ENV}.")


def _remove(path: Path, why: str) -> str:
    """The remedy where the key itself may be known, or is not a key: a new one."""
    return f"{why}: remove it (`rm {path}`) and a new one is made on the next run."


def _read(path: Path) -> bytes | None:
    """The key in `path`, None if there is none; refused when anyone else could know it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(path, "is a symbolic link", _remove(
                path, "What it points to could be changed by whoever can write there")) from None
        raise _refused(path, f"cannot be read ({exc.strerror})",
                       f"Make it readable by you alone (`chmod 600 {path}`).") from None
    try:
        data = _checked(path, os.fstat(fd), lambda size: os.read(fd, size))
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(data.decode("ascii"))
    except ValueError:
        secret = b""
    if len(secret) != KEY_BYTES:
        raise _refused(path, f"is not a key ({KEY_BYTES * 2} hexadecimal digits)",
                       _remove(path, "It was not written by retcon-sandbox"))
    return secret


def _checked(path: Path, info: os.stat_result, read: Callable[[int], bytes]) -> bytes:
    """The key file's content, once nobody else could know or swap it (each refusal with the
    remedy that fits it)."""
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        raise _refused(path, "is not a regular file", f"Move it away (`mv {path} "
                       f"{path}.old`) and a new key is made on the next run.")
    if info.st_uid != os.geteuid():
        raise _refused(path, f"belongs to another user (uid {info.st_uid})", _remove(
            path, "Its owner knows it and can change it (you may need sudo to remove it)"))
    if info.st_nlink > 1:
        raise _refused(path, f"is a hard link (the file has {info.st_nlink} names)", _remove(
            path, "Its other names could be read or changed where others can reach them"))
    if mode & 0o077:
        raise _refused(path, f"is readable or writable by others (mode {mode:o})", _remove(
            path, "Someone may have read or changed it") + f" If nobody could have, "
            f"`chmod 600 {path}` keeps it.")
    folder = _open_folder(path.parent)
    if folder is not None:
        raise _refused(path, f"is in a folder others can write ({folder[0]}, mode "
                       f"{folder[1]:o}), where it could be swapped", f"Make the folder yours "
                       f"alone (`chmod go-w {folder[0]}`); then, since the key may have been "
                       f"swapped, remove it (`rm {path}`) and a new one is made.")
    return read(1024).strip()


def _open_folder(directory: Path) -> tuple[Path, int] | None:
    """The first folder from `directory` up that others can write (a sticky one, as /tmp, lets
    nobody rename what is not theirs), with its mode; None when there is none."""
    for folder in (directory, *directory.parents):
        try:
            info = os.stat(folder)
        except OSError:
            return None
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return folder, mode
    return None


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
