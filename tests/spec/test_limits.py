"""A spec may come from someone else: it can only lower the resource limits, and names its
image by `name[:tag]` only (issue 19, items 2 and 6). The command line raises limits, capped by
what the engine has."""

from __future__ import annotations

import pytest

from retcon_sandbox.commands.options import check_engine_limits, raised_limits
from retcon_sandbox.errors import UsageError
from retcon_sandbox.spec.settings import (
    DEFAULTS,
    GIB,
    LOWER_ONLY,
    SandboxSettings,
    SettingError,
)

ABOVE = {"memory": "256g", "workspace_size": "256g", "tmp_size": "100g", "pids": 1_000_000,
         "cpus": 64, "timeout": 86_400, "setup_timeout": 86_400}


@pytest.mark.parametrize("key", sorted(LOWER_ONLY))
def test_a_spec_cannot_raise_a_limit_above_its_default(key: str) -> None:
    with pytest.raises(SettingError) as caught:
        SandboxSettings.parse({key: ABOVE[key]})
    where, message = caught.value.args
    assert where == key
    shown = ABOVE[key] if isinstance(ABOVE[key], str) else str(ABOVE[key])  # never 1e+06
    assert f"{shown} is above the default" in message  # the value
    assert LOWER_ONLY[key] in message  # the option to use


@pytest.mark.parametrize(("key", "low"), [("memory", "512m"), ("workspace_size", "2g"),
                                          ("tmp_size", "64m"), ("pids", 64), ("cpus", 0.5),
                                          ("timeout", 600)])
def test_a_spec_may_lower_a_limit_or_keep_the_default(key: str, low: object) -> None:
    SandboxSettings.parse({key: low})


def test_the_message_names_key_value_cap_and_option() -> None:
    with pytest.raises(SettingError) as caught:
        SandboxSettings.parse({"memory": "256g"})
    assert caught.value.args == ("memory", "256g is above the default 2g, the most a spec may "
                                 "ask for: a spec can only lower this limit. Raise it on the "
                                 "command line instead (--memory 256g), up to what the engine "
                                 "has")


def test_the_command_line_raises_limits() -> None:
    raised = DEFAULTS.replace(memory="8g", cpus=4.0, pids=4096, workspace_size="8g",
                              tmp_size="2g", timeout=3600)
    assert (raised.memory, raised.cpus, raised.pids, raised.timeout) == (8 * GIB, 4.0, 4096, 3600)


def test_raised_limits_are_capped_by_the_engine() -> None:
    engine_memory, engine_cpus = 16 * GIB, 4
    check_engine_limits(DEFAULTS.replace(memory="16g", cpus=4.0), engine_memory, engine_cpus)
    for settings, option in ((DEFAULTS.replace(memory="17g"), "--memory"),
                             (DEFAULTS.replace(workspace_size="32g"), "--workspace-size"),
                             (DEFAULTS.replace(tmp_size="20g"), "--tmp-size"),
                             (DEFAULTS.replace(cpus=8.0), "--cpus")):
        with pytest.raises(UsageError, match=f"{option} .*above what the Docker engine has"):
            check_engine_limits(settings, engine_memory, engine_cpus)
    check_engine_limits(DEFAULTS, 1 * GIB, 1)  # the defaults are not the user's choice
    assert not raised_limits(DEFAULTS) and not raised_limits(DEFAULTS.replace(memory="1g"))
    assert raised_limits(DEFAULTS.replace(cpus=8.0))  # only then is the engine asked


@pytest.mark.parametrize("name", [
    "sha256:" + "ab" * 32, "sha256:abcd", "SHA256:abcd", "ab" * 32, "debian@sha256:" + "0" * 64,
    "retcon-sandbox/env@sha256:" + "1" * 64, "Upper/Case", "a b", "-x", "x:", "x::y",
])
def test_a_spec_image_is_a_name_and_tag_never_an_id(name: str) -> None:
    with pytest.raises(SettingError) as caught:
        SandboxSettings.parse({"image": name})
    assert caught.value.args[0] == "image"


@pytest.mark.parametrize("name", [
    "retcon-sandbox/base", "retcon-sandbox/node:18f74c65f2c4", "debian:bookworm-slim",
    "localhost:5000/team/image:1.2", "docker.io/library/python:3.12", "abcd", "my_image__x",
])
def test_a_spec_image_may_be_any_reference(name: str) -> None:
    assert SandboxSettings.parse({"image": name}).image == name


def test_the_command_line_may_name_an_image_by_id() -> None:
    image = "sha256:" + "ab" * 32
    assert DEFAULTS.replace(image=image).image == image


def test_numbers_in_messages_print_as_a_person_writes_them(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """`1000000`, never `1e+06`: in a range, a value shown, an environment variable's bound."""
    from retcon_sandbox.errors import ConfigError, env_number
    from retcon_sandbox.text import plain_number

    with pytest.raises(SettingError) as caught:
        SandboxSettings.parse({"pids": 2_000_000})
    assert caught.value.args == ("pids", "must be from 32 to 1000000")
    with pytest.raises(SettingError) as caught:
        SandboxSettings.parse({"pids": 1_000_000})
    assert "1000000 is above the default 512" in caught.value.args[1]
    monkeypatch.setenv("RETCON_SANDBOX_TEST_NUMBER", "-1")
    with pytest.raises(ConfigError) as error:
        env_number("RETCON_SANDBOX_TEST_NUMBER", 2e6)
    assert "at most 1000000000" in error.value.message and "(default 2000000)" in error.value.hint
    assert [plain_number(v) for v in (1e6, 86_400.0, 0.5, 2.25, 7)] == \
        ["1000000", "86400", "0.5", "2.25", "7"]
    assert "e+" not in plain_number(1e15)
