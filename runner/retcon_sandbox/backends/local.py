"""The local-directory backend: the helper as a plain subprocess in a temporary directory.

It isolates nothing. It exists so the loop can be tested without Docker, and a user gets it
only by asking for it by name (`--sandbox local`), with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import marshal
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from retcon_sandbox import userkey
from retcon_sandbox.backends.api import (
    LINE_CAP,
    HelperSandbox,
    Preparation,
    Preparer,
    check_isolation,
)
from retcon_sandbox.errors import SandboxError
from retcon_sandbox.resources import helper_source


class PipeTransport:
    """The local helper's pipes. Trusted code only, so no deadline is enforced here."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def set_deadline(self, deadline: float | None) -> None:
        pass

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def readline(self) -> bytes:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline(LINE_CAP + 1)
        if len(line) > LINE_CAP:
            raise SandboxError(f"the local helper sent a line over {LINE_CAP} bytes")
        return line

    def read(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        return self._proc.stdout.read(n)

    def close(self) -> None:
        if self._proc.stdin:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()

    def describe_failure(self) -> str:
        return f"the local helper exited with {self._proc.poll()}"


class LocalBackend:
    name = "local"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        # Trusted code only: the host's PATH, so the host's toolchain is what runs.
        self._env = {"PATH": os.environ.get("PATH", ""), **(env or {})}

    @contextlib.contextmanager
    def open(self, label: str) -> Iterator[HelperSandbox]:
        root = Path(tempfile.mkdtemp(prefix="retcon-local-"))
        try:
            compiled = root / "helper.pyc"
            compiled.write_bytes(_compiled_helper())
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(compiled), "--workspace",
                 str(root / "workspace"), "--no-isolation-checks"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root)
        except OSError as exc:
            _remove(root)
            raise SandboxError(f"cannot start the local helper: {exc}") from None
        box = HelperSandbox(PipeTransport(proc), self._env)
        try:
            check_isolation(box, "the local sandbox")
            compiled.unlink()  # read whole before the helper answered: the workspace is alone
            yield box
        finally:
            box.close()
            _remove(root)

    def reap(self) -> int:
        return 0

    def describe(self) -> str:
        return "local (UNSANDBOXED: for tests only)"

    def engine_name(self) -> str:
        return self.name

    def preparer(self, job: Preparation) -> Preparer | None:
        return None  # no prepared environments: the host's own toolchain runs

    def environment(self) -> str:
        """The host's toolchain, as far as it can be named: the variables the commands see."""
        return f"local env:{userkey.load().digest('local-env', self._env)}"


@functools.cache
def _compiled_helper() -> bytes:
    """The helper as a compiled file, made once per process: this interpreter runs it as
    `-I -S -c <the helper>` runs the source (the code object `-c` makes, named `<string>`),
    as the containers start it, without compiling 80 KB of source at each sandbox's start
    (a third of the helper's start-up CPU)."""
    code = compile(helper_source(), "<string>", "exec", dont_inherit=True, optimize=0)
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)


def _remove(root: Path) -> None:
    """Our own temporary directory, however deep (shutil.rmtree recurses per level)."""
    subprocess.run(["rm", "-rf", "--", str(root)], check=False)
