"""retcon-sandbox's in-container helper. Standard library only; Python 3.8+.

Started once per container (`python3 -I -c <this file> --workspace DIR`), it speaks JSON lines
over stdin/stdout: one request per line, one response per line. A request may carry
`"payload": N`, in which case N raw bytes follow its line. No network port is opened, so it
works with the network off.

It confines every path to the workspace, never follows a symlink out of it, writes atomically,
and runs commands with a timeout that kills the command's whole process tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tarfile
import time
from typing import IO, Any, Callable, Dict

Response = Dict[str, Any]

PR_SET_CHILD_SUBREAPER = 36
HEAD_BYTES = 24 * 1024
TAIL_BYTES = 24 * 1024
DIFF_FLOOR = 10  # changed lines at or under which a write is always "small"
DIFF_CEIL = 80  # changed lines at or over which the diff is always shown
DIFF_RATIO = 0.40  # share of the file changed over which the diff is shown
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ToolError(Exception):
    """An error the caller (and the model) can act on."""


# --- paths ----------------------------------------------------------------------------------


class Workspace:
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    def _parts(self, rel: object) -> list[str]:
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty relative path")
        if "\0" in rel:
            raise ToolError("path contains a NUL byte")
        if rel.startswith("/"):
            raise ToolError("absolute paths are refused: give a path relative to the repository")
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            raise ToolError("`..` is refused: paths stay inside the repository")
        if not parts:
            raise ToolError("path names the repository root, not a file")
        return parts

    def for_read(self, rel: str) -> str:
        """Path for reading; symlinks are followed only while they stay in the workspace."""
        full = os.path.join(self.root, *self._parts(rel))
        real = os.path.realpath(full)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise ToolError(f"{rel} is a symlink that points outside the workspace: refused")
        return real

    def for_write(self, rel: str) -> str:
        """Path for writing or deleting: no component may be a symlink."""
        parts = self._parts(rel)
        if ".git" in parts:
            raise ToolError("paths inside .git are refused")
        current = self.root
        for i, part in enumerate(parts):
            current = os.path.join(current, part)
            if os.path.islink(current):
                raise ToolError(f"{rel} goes through a symlink ({'/'.join(parts[: i + 1])}): "
                                "refused; edit the real path")
            if i < len(parts) - 1 and os.path.exists(current) and not os.path.isdir(current):
                raise ToolError(f"{rel}: {'/'.join(parts[: i + 1])} is a file, not a directory")
        return current

    def relative(self, full: str) -> str:
        return os.path.relpath(full, self.root)


# --- text helpers ---------------------------------------------------------------------------


def decode_text(data: bytes) -> str | None:
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / 1024 / 1024:.1f} MB"


def write_summary(rel: str, old: bytes | None, new: bytes) -> Response:
    """What a write did, fettle-style: `+N -M`, no-op detection, the diff for large rewrites."""
    new_text = decode_text(new)
    if old is not None and old == new:
        return {"status": "unchanged", "summary": f"no changes: {rel} already has this content"}
    if new_text is None:
        verb = "Replaced" if old is not None else "Created"
        return {"status": "binary", "summary": f"{verb} binary file {rel} ({len(new)} bytes)"}
    lines = new_text.count("\n") + (0 if new_text.endswith("\n") or not new_text else 1)
    size = f"{human_size(len(new))}, {lines} lines"
    old_text = decode_text(old) if old is not None else None
    if old is None:
        return {"status": "created", "summary": f"Created {rel} ({size})"}
    if old_text is None:
        return {"status": "updated", "summary": f"Wrote {rel} ({size}; it was binary)"}
    diff = list(difflib.unified_diff(old_text.splitlines(True), new_text.splitlines(True),
                                     "a/" + rel, "b/" + rel, n=3))
    added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
    removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
    result: Response = {"status": "updated", "added": added, "removed": removed,
                        "summary": f"Wrote {rel} ({size}, +{added} -{removed})"}
    changed = added + removed
    old_lines = max(1, old_text.count("\n"))
    if changed > DIFF_FLOOR and (changed >= DIFF_CEIL or changed / old_lines > DIFF_RATIO):
        result["diff"] = "".join(d if d.endswith("\n") else d + "\n\\ No newline at end of file\n"
                                 for d in diff)
    return result


def numbered(text: str, offset: int | None, limit: int | None) -> tuple[str, int, int, int]:
    lines = text.splitlines()
    start = max(1, offset or 1)
    end = len(lines) if not limit else min(len(lines), start - 1 + limit)
    body = "".join(f"{n:6d}\t{lines[n - 1]}\n" for n in range(start, end + 1))
    return body, len(lines), start, end


# --- processes --------------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Orphans of commands re-parent to us, so 'the whole tree' stays findable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def descendants(pid: int) -> list[int]:
    kids = children_map()
    found: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(kids.get(p, []))
    return found


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL the command and everything it started, until nothing of it is left."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    me = os.getpid()
    for _ in range(200):
        pids = descendants(me)
        alive = [p for p in pids if not _is_zombie(p)]
        reap()
        if not alive:
            break
        for p in alive:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.01)
    reap()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def _prefer_oom_victim() -> None:
    """In the child: be the out-of-memory killer's first choice, not the helper."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("1000")


class Capture:
    """Head and tail of a stream, and its total size."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > TAIL_BYTES:
                del self.tail[: len(self.tail) - TAIL_BYTES]

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if self.total <= HEAD_BYTES + TAIL_BYTES and len(self.head) + len(self.tail) == self.total:
            return head + self.tail.decode("utf-8", "replace")
        skipped = self.total - len(self.head) - len(self.tail)
        tail = self.tail.decode("utf-8", "replace")
        return f"{head}\n[... {skipped} bytes of output omitted ...]\n{tail}"


def run_command(ws: Workspace, cmd: str, timeout: float, env: dict[str, str] | None
                ) -> Response:
    start = time.monotonic()
    full_env = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    full_env.update(env or {})
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", cmd], cwd=ws.root, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, preexec_fn=_prefer_oom_victim)
    except OSError as exc:
        raise ToolError(f"cannot start the command: {exc}") from None
    capture = Capture()
    timed_out = _pump(proc, capture, start + timeout)
    if timed_out:
        kill_tree(proc)
    code = proc.wait()
    kill_tree(proc)  # nothing a command started outlives it
    _drain(proc, capture)
    return {
        "exit_code": code,
        "timed_out": timed_out,
        "output": capture.text(),
        "total_bytes": capture.total,
        "truncated": capture.total > len(capture.head) + len(capture.tail),
        "seconds": round(time.monotonic() - start, 3),
    }


def _pump(proc: subprocess.Popen, capture: Capture,  # type: ignore[type-arg]
          deadline: float) -> bool:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    fd = proc.stdout.fileno()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if not sel.select(timeout=min(left, 0.5)):
                if proc.poll() is not None:
                    return False
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            capture.add(chunk)
    finally:
        sel.close()


def _drain(proc: subprocess.Popen, capture: Capture) -> None:  # type: ignore[type-arg]
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        while True:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            capture.add(chunk)
    except (BlockingIOError, OSError):
        pass
    proc.stdout.close()


# --- isolation checks -----------------------------------------------------------------------


def isolation_problems() -> list[str]:
    problems: list[str] = []
    if os.getuid() == 0 or os.geteuid() == 0:
        problems.append("runs as root (expected a fixed non-root uid)")
    status: dict[str, str] = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                status[key] = value.strip()
    except OSError:
        problems.append("cannot read /proc/self/status")
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        if cap in status and int(status[cap], 16) != 0:
            problems.append(f"has capabilities ({cap}={status[cap]}; expected none)")
    if status.get("NoNewPrivs", "1") != "1":
        problems.append("no-new-privileges is off")
    names = [name for _, name in socket.if_nameindex()]
    extra = [n for n in names if n != "lo"]
    if extra:
        problems.append(f"has network interfaces besides loopback: {', '.join(extra)}")
    return problems


# --- requests -------------------------------------------------------------------------------


class Helper:
    def __init__(self, workspace: str, checks: bool) -> None:
        self.ws = Workspace(workspace)
        self.checks = checks

    def op_hello(self, req: Response, payload: bytes) -> Response:
        problems = isolation_problems() if self.checks else []
        return {"uid": os.getuid(), "python": sys.version.split()[0],
                "subreaper": become_subreaper(), "problems": problems}

    def op_extract(self, req: Response, payload: bytes) -> Response:
        """Unpack the tree that goes in: fresh files only (O_EXCL), never through a symlink."""
        count = 0
        made = set()
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
            for member in tar:
                target = self.ws.for_write(member.name)
                parent = os.path.dirname(target)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                if member.issym():
                    os.symlink(member.linkname, target)
                elif member.isfile():
                    source = tar.extractfile(member)
                    mode = 0o755 if member.mode & 0o111 else 0o644
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 mode)
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(source.read() if source else b"")
                else:
                    continue
                count += 1
        return {"files": count}

    def op_read(self, req: Response, payload: bytes) -> Response:
        path = self.ws.for_read(req["path"])
        if os.path.isdir(path):
            raise ToolError(f"{req['path']} is a directory; use list_files")
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            raise ToolError(f"{req['path']} does not exist") from None
        text = decode_text(data)
        if text is None:
            return {"binary": True, "size": len(data),
                    "text": f"{req['path']} is a binary file ({len(data)} bytes); not shown"}
        body, total, start, end = numbered(text, req.get("offset"), req.get("limit"))
        return {"binary": False, "size": len(data), "lines": total, "start": start, "end": end,
                "text": body}

    def op_write(self, req: Response, payload: bytes) -> Response:
        path = self.ws.for_write(req["path"])
        if os.path.isdir(path):
            raise ToolError(f"{req['path']} is a directory")
        if req.get("mode") == "120000":
            return self._symlink(req["path"], path, payload.decode("utf-8", "surrogateescape"))
        old = None
        if os.path.exists(path):
            with open(path, "rb") as handle:
                old = handle.read()
        result = write_summary(req["path"], old, payload)
        mode = 0o755 if req.get("mode") == "100755" else 0o644
        if result["status"] != "unchanged" or req.get("mode"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._atomic_write(path, payload, mode)
        return result

    def op_delete(self, req: Response, payload: bytes) -> Response:
        path = self.ws.for_write(req["path"])
        if os.path.isdir(path):
            raise ToolError(f"{req['path']} is a directory; delete the files in it")
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise ToolError(f"{req['path']} does not exist") from None
        return {"summary": f"Deleted {req['path']}"}

    def op_list(self, req: Response, payload: bytes) -> Response:
        base = self.ws.for_read(req["path"]) if req.get("path") else self.ws.root
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            for name in sorted(filenames):
                found.append(self.ws.relative(os.path.join(dirpath, name)))
        return {"files": found}

    def op_run(self, req: Response, payload: bytes) -> Response:
        return run_command(self.ws, req["cmd"], float(req.get("timeout", 600)), req.get("env"))

    @staticmethod
    def _symlink(rel: str, path: str, target: str) -> Response:
        tmp = f"{path}.retcon-tmp-{os.getpid()}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, path)
        return {"status": "created", "summary": f"Linked {rel} -> {target}"}

    @staticmethod
    def _atomic_write(path: str, data: bytes, mode: int) -> None:
        tmp = f"{path}.retcon-tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise


def read_exactly(stream: IO[bytes], n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("stdin closed inside a payload")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(helper: Helper, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    while True:
        line = stdin.readline()
        if not line:
            return
        req: Response = {}
        response: Response
        try:
            req = json.loads(line)
            payload = read_exactly(stdin, int(req["payload"])) if req.get("payload") else b""
            handler: Callable[[Response, bytes], Response] | None = getattr(
                helper, "op_" + str(req.get("op")), None)
            if handler is None:
                raise ToolError(f"unknown operation {req.get('op')!r}")
            response = {"ok": True}
            response.update(handler(req, payload))
        except ToolError as exc:
            response = {"ok": False, "error": str(exc)}
        except OSError as exc:
            response = {"ok": False, "error": f"{req.get('path', 'io')}: {exc.strerror}"}
        except (ValueError, KeyError, TypeError, tarfile.TarError) as exc:
            response = {"ok": False, "error": f"bad request: {exc}"}
        response["id"] = req.get("id")
        stdout.write(json.dumps(response).encode() + b"\n")
        stdout.flush()


def main(argv: list[str]) -> None:
    workspace, checks = "/workspace", True
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--workspace":
            workspace = args.pop(0)
        elif arg == "--no-isolation-checks":
            checks = False
    os.makedirs(workspace, exist_ok=True)
    serve(Helper(workspace, checks), sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main(sys.argv[1:])
