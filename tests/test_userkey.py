"""The user's key: made once, private, outside every repository; refused when anyone else could
know or swap it; given by RETCON_SANDBOX_NOTES_KEY in CI."""

from __future__ import annotations

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


def refused(state: Path) -> str:
    userkey._loaded.clear()
    with pytest.raises(ConfigError) as caught:
        userkey.load()
    return caught.value.message


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
    monkeypatch.setenv(userkey.ENV, "a" * 64)
    first = userkey.load()
    assert first.secret == b"a" * 64 and not state.exists()  # no file is made
    monkeypatch.setenv(userkey.ENV, "b" * 64)
    second = userkey.load()
    assert first.mac(b"x") != second.mac(b"x")
    assert first.digest("pass-env", {"TOKEN": "1"}) != second.digest("pass-env", {"TOKEN": "1"})
    monkeypatch.setenv(userkey.ENV, "")  # an unset secret in CI expands to nothing
    assert userkey.load().origin == str(state)


def test_a_key_in_the_environment_may_be_any_bytes(state: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    monkeypatch.setenv(userkey.ENV, "\udcff" * 40)  # 40 bytes 0xff, not UTF-8
    key = userkey.load()
    assert key.secret == b"\xff" * 40 and key.mac(b"x") != userkey.UserKey(b"a" * 40, "").mac(b"x")
