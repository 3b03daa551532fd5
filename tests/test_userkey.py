"""The user's key: made once, private, outside every repository; refused when anyone else could
know or swap it; given by RETCON_SANDBOX_NOTES_KEY in CI."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from retcon_sandbox import userkey
from retcon_sandbox.errors import ConfigError


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "retcon-sandbox" / "notes.key"


def test_made_on_first_use_private_and_kept(state: Path) -> None:
    key = userkey.load()
    info = state.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid()
    assert stat.S_IMODE(state.parent.stat().st_mode) & 0o077 == 0
    assert len(key.secret) == 32 and key.secret.hex() in state.read_text()
    userkey._loaded.clear()
    assert userkey.load() == key  # read back, not made again
    assert [p.name for p in state.parent.iterdir()] == ["notes.key"]  # no temporary left


FIRST = "5f0e9a3c7b1d2e8f4a6c0b9d3e7f1a2c8b4d6e0f9a1c3b5d7e2f4a6c8b0d1e3f"  # random, as
SECOND = "c2a7e9f13b5d8046a1e3c7b9d2f4068ae1c3b5d79f2e4a6c8b0d1f3e5a7c9b2d"  # CI's would be


def refusal(state: Path) -> ConfigError:
    userkey._loaded.clear()
    with pytest.raises(ConfigError) as caught:
        userkey.load()
    return caught.value


def refused(state: Path) -> str:
    return refusal(state).message


def test_a_key_anyone_else_could_know_or_swap_is_refused(state: Path, tmp_path: Path) -> None:
    userkey.load()
    secret = state.read_bytes()
    state.chmod(0o640)
    assert "readable or writable by others" in refused(state)
    state.chmod(0o602)
    assert "readable or writable by others" in refused(state)
    state.unlink()
    planted = tmp_path / "planted"
    planted.write_bytes(secret)
    planted.chmod(0o600)
    state.symlink_to(planted)  # a link, even to a private file, is not used
    assert "symbolic link" in refused(state)
    state.unlink()
    state.mkdir()
    assert "not a regular file" in refused(state)
    state.rmdir()
    state.write_bytes(b"not a key\n")
    state.chmod(0o600)
    assert "is not a key" in refused(state)
    state.write_bytes(secret)
    if os.geteuid() == 0:
        os.chown(state, 4321, 4321)
        assert "belongs to another user" in refused(state)
        os.chown(state, 0, 0)
    userkey._loaded.clear()
    assert userkey.load().secret.hex() in secret.decode()
    assert state.read_bytes() == secret  # never replaced


def test_ci_gives_the_key_in_the_environment(state: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv(userkey.ENV, "short")
    with pytest.raises(ConfigError, match="too short"):
        userkey.load()
    monkeypatch.setenv(userkey.ENV, FIRST)
    first = userkey.load()
    assert first.secret == FIRST.encode() and not state.exists()  # no file is made
    monkeypatch.setenv(userkey.ENV, SECOND)
    second = userkey.load()
    assert first.mac(b"x") != second.mac(b"x")
    assert first.digest("pass-env", {"TOKEN": "1"}) != second.digest("pass-env", {"TOKEN": "1"})
    monkeypatch.setenv(userkey.ENV, "")  # an unset secret in CI expands to nothing
    assert userkey.load().origin == str(state)


def test_a_key_in_the_environment_may_be_any_bytes(state: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    raw = bytes(b | 0x80 for b in hashlib.sha256(b"k").digest() * 2)[:40]  # not UTF-8
    monkeypatch.setenv(userkey.ENV, raw.decode("utf-8", "surrogateescape"))
    key = userkey.load()
    assert key.secret == raw and key.mac(b"x") != userkey.UserKey(b"a" * 40, "").mac(b"x")


def test_a_key_with_other_names_or_in_a_folder_others_write_is_refused(state: Path,
                                                                       tmp_path: Path) -> None:
    """A hard link is the same file under another name, which may be somewhere others can
    read or swap; a folder others can write lets them replace the key with theirs."""
    userkey.load()
    secret = state.read_bytes()
    other = tmp_path / "elsewhere.key"
    os.link(state, other)
    caught = refusal(state)
    assert "is a hard link (the file has 2 names)" in caught.message
    assert f"rm {state}" in caught.hint and "chmod" not in caught.hint
    other.unlink()
    folder = state.parent
    folder.chmod(0o777)
    caught = refusal(state)
    assert f"is in a folder others can write ({folder}, mode 777)" in caught.message
    assert f"chmod go-w {folder}" in caught.hint and f"rm {state}" in caught.hint
    folder.chmod(0o1777)  # sticky, as /tmp: nobody renames what is not theirs
    userkey._loaded.clear()
    assert userkey.load().secret.hex() in secret.decode()
    folder.chmod(0o700)


def test_each_refusal_gives_the_remedy_that_fits_it(state: Path, tmp_path: Path) -> None:
    userkey.load()
    secret = state.read_bytes()
    state.chmod(0o644)  # perhaps read: a new key, unless nobody could have
    caught = refusal(state)
    assert f"rm {state}" in caught.hint and f"chmod 600 {state}" in caught.hint
    state.unlink()
    planted = tmp_path / "planted"
    planted.write_bytes(secret)
    planted.chmod(0o600)
    state.symlink_to(planted)  # chmod would change the target, and fix nothing
    caught = refusal(state)
    assert f"rm {state}" in caught.hint and "chmod" not in caught.hint
    state.unlink()
    state.mkdir()  # `rm` does not remove a folder
    caught = refusal(state)
    assert f"mv {state} {state}.old" in caught.hint and "rm " not in caught.hint
    state.rmdir()
    state.write_bytes(b"not a key\n")
    state.chmod(0o600)
    caught = refusal(state)
    assert f"rm {state}" in caught.hint and "chmod" not in caught.hint


@pytest.mark.parametrize("secret", ["a" * 64, "ab" * 32, "0123456789" * 4, "password" * 4,
                                    "abcdefghijklmnopqrstuvwxyz0123456789",
                                    "k" * 40 + "1"])
def test_a_shared_key_plainly_not_random_is_refused(state: Path, monkeypatch: pytest.MonkeyPatch,
                                                    secret: str) -> None:
    monkeypatch.setenv(userkey.ENV, secret)
    caught = refusal(state)
    assert caught.message.startswith(f"{userkey.ENV} is plainly not random (about ")
    assert "openssl rand -hex 32" in caught.hint and "secret store" in caught.hint
    assert not state.exists()


@pytest.mark.parametrize("secret", [FIRST, "5f0e9a3c7b1d2e8f4a6c0b9d3e7f1a2c",
                                    "a shared secret from the CI's store, 40 chars",
                                    "qX7-vR2_mK9pL4tZ8wN1cB6hJ3yF0sD5"])
def test_a_random_or_long_enough_key_is_taken(state: Path, monkeypatch: pytest.MonkeyPatch,
                                              secret: str) -> None:
    """32 random hexadecimal digits are 128 bits: the least taken."""
    monkeypatch.setenv(userkey.ENV, secret)
    userkey._loaded.clear()
    assert userkey.load().secret == secret.encode()


def test_any_text_as_a_mac_is_only_a_mac_that_does_not_verify(state: Path) -> None:
    """A manifest or note from anyone may carry any text where its HMAC goes."""
    key = userkey.load()
    assert key.verify(b"data", key.mac(b"data"))
    for mac in ("é" * 64, "", key.mac(b"data")[:-1], "\udcff" * 64):
        assert not key.verify(b"data", mac)
