"""Host variables enter a sandbox only by `--pass-env NAME` on the command line, and never one
that looks like a credential, whatever its name."""

from __future__ import annotations

import pytest

from retcon_sandbox.backends import hostaccess
from retcon_sandbox.backends.hostaccess import credential_problem
from retcon_sandbox.errors import UsageError
from tests.conftest import Demo, cli, git

LOCAL = ("--sandbox", "local", "--non-interactive")


@pytest.mark.parametrize(("name", "value"), [
    ("DATABASE_URL", "postgres://app:hunter2@db.internal:5432/app"),
    ("GH_PAT", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ("NPM_CONFIG__AUTH", "dXNlcjpwYXNz"),
    ("MIRROR", "https://proxy.example/?key=sk-" + "Abc123Def456Ghi789Jkl012"),
    ("SETTINGS", "aws=AKIA" + "ABCDEFGHIJKLMNOP"),
    ("CONFIG", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn..."),
    ("HEADER", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig"),
    ("OPAQUE", "q8ZfV2xN7rT1bK9mW4sY6pL3dH0cJ5gA"),
])
def test_credentials_are_refused_whatever_the_name(name: str, value: str) -> None:
    assert credential_problem(name, value) is not None


@pytest.mark.parametrize(("name", "value"), [
    ("LANG", "C.UTF-8"), ("TZ", "Europe/Berlin"), ("PYTHONHASHSEED", "0"),
    ("CI_COMMIT", "0123456789abcdef0123456789abcdef01234567"),
    ("PROJECT_DIR", "/home/runner/work/project/project/src/package/subpackage"),
])
def test_ordinary_variables_pass(name: str, value: str) -> None:
    assert credential_problem(name, value) is None


@pytest.mark.slow
def test_pass_env_reaches_the_commands(demo: Demo) -> None:
    text = demo.spec.read_text()
    demo.spec.write_text(text.replace('test = "', 'test = "test \\"$RS_GREETING\\" = hello && ', 1))
    refused = cli("execute", str(demo.spec), *LOCAL)
    assert refused.code == 3, refused.out + refused.err
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(text.replace('test = "', 'test = "test \\"$RS_GREETING\\" = hello && ', 1))
    passed = cli("execute", str(demo.spec), *LOCAL, "--pass-env", "RS_GREETING",
                 env={"RS_GREETING": "hello"})
    assert passed.code == 0, passed.out + passed.err


@pytest.mark.parametrize(("args", "env", "message"), [
    (("--pass-env", "DATABASE_URL"), {"DATABASE_URL": "postgres://u:secret@h/db"},
     "--pass-env DATABASE_URL: refused, its value looks like a credential"),
    (("--pass-env", "GH_TOKEN"), {"GH_TOKEN": "x"},
     "--pass-env GH_TOKEN: refused, its name says it holds a credential"),
    (("--pass-env", "RS_UNSET_VARIABLE"), {}, "the variable is not set on this host"),
    (("--pass-env", "A=b"), {}, "not a variable name"),
])
def test_bad_pass_env_is_refused_before_anything_is_written(
        demo: Demo, args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    before = demo.spec.read_bytes()
    result = cli("execute", str(demo.spec), *LOCAL, *args, env=env)
    assert result.code == 2, result.out + result.err
    assert message in result.err
    assert "Traceback" not in result.err
    assert demo.spec.read_bytes() == before
    assert git(demo.path, "branch", "--list", "feature-clean") == ""


def test_setup_allow_address_takes_networks_never_loopback_or_metadata() -> None:
    access = hostaccess.from_command_line([], False, allowed_addresses=[
        "203.0.113.80", " 10.20.0.0/16", "2001:db8::1"])
    assert access.setup.allowed_addresses == ("203.0.113.80/32", "10.20.0.0/16",
                                              "2001:db8::1/128")
    for bad, said in (("0.0.0.0/0", "it reaches 0.0.0.0/8"), ("127.0.0.1", "127.0.0.0/8"),
                      ("169.254.169.254", "169.254.0.0/16"), ("::1", "::1/128"),
                      ("pypi.org", "expected an address or a network")):
        with pytest.raises(UsageError, match="--setup-allow-address") as caught:
            hostaccess.from_command_line([], False, allowed_addresses=[bad])
        assert said in caught.value.message, caught.value.message
