"""retcon-sandbox's in-container helper. Standard library only; Python 3.8+.

Started once per container (`/usr/local/bin/python3` or `/usr/bin/python3`, `-I -S -c <this
file> --workspace DIR`: the system interpreter, never one found through PATH, nor any `site` or
`.pth` file), it speaks JSON lines over stdin/stdout: one request per line, one response per
line, carrying the request's id. A request may carry `"payload": N`, in which case N raw bytes
follow its line, or `"chunked": true`, in which case frames follow (a 4-byte big-endian length,
then that many bytes) up to an empty frame: how a tree streams in. No network port is opened, so
it works with the network off. It makes itself non-dumpable, so nothing else in the container
can read or write its pipes through /proc or trace it.

It confines every path to the workspace, never follows a symlink out of it, writes atomically,
and runs commands with a timeout that kills the command's whole process tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import fcntl
import io
import json
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time
import zlib
from typing import IO, Any, Callable, Dict, Iterable, Iterator

from retcon_sandbox.protocol import (  # replaced by that module's text when shipped
    EXPORT_BLOCK,
    EXPORT_CHUNK,
    EXPORT_DATA,
    EXPORT_ERROR,
    EXPORT_PACKED,
    EXPORT_RAW,
    REQUESTS,
    DeleteRequest,
    DeleteResponse,
    ExportRequest,
    ExportResponse,
    ExtractRequest,
    ExtractResponse,
    HelloRequest,
    HelloResponse,
    ListRequest,
    ListResponse,
    OutputCapture,
    ReadRequest,
    ReadResponse,
    ResetRequest,
    ResetResponse,
    RunRequest,
    RunResponse,
    WriteRequest,
    WriteResponse,
    export_frame,
    export_header,
    from_wire,
    to_wire,
)
from retcon_sandbox.sandbox.supervisor import (  # replaced by that module's text when shipped
    COMMAND_ENV,
    TREE_LIST,
    _prefer_oom_victim,
    clear,
    harden,
    is_dumpable,
    make_dirs,
    mounts,
    reap,
    scratch_mounts,
)

Response = Dict[str, Any]

PR_SET_CHILD_SUBREAPER = 36
# The network namespace's tables (in /proc/net) of what may outlive a process: sockets, and IPv6
# flow labels, which an unprivileged uid may make linger for minutes.
NET_TABLES = ("tcp", "tcp6", "udp", "udp6", "udplite", "udplite6", "raw", "raw6", "icmp",
              "icmp6", "unix", "packet", "netlink", "ip6_flowlabel", "anycast6", "igmp", "igmp6",
              "mcfilter", "mcfilter6")
SETTLE_S = 0.5  # how long `reset` waits for the sockets of killed processes to close
PAGE_LINES = 2000  # lines in one read_file answer at most
PAGE_BYTES = 128 * 1024  # bytes in one read_file answer at most
LINE_CHARS = 4000  # characters of one line shown at most
READ_MAX = 256 * 1024 * 1024  # the largest file read_file opens
LIST_MAX = 20_000  # names in one list_files answer at most
DIFF_FLOOR = 10  # changed lines at or under which a write is always "small"
DIFF_CEIL = 80  # changed lines at or over which the diff is always shown
DIFF_RATIO = 0.40  # share of the file changed over which the diff is shown
class ToolError(Exception):
    """An error the caller (and the model) can act on."""


# --- paths ----------------------------------------------------------------------------------


class Workspace:
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    def _parts(self, rel: object, exact: bool = False) -> list[str]:
        """A path's components. Names from the repository (`exact`) are taken as they are;
        names the model gives are refused with control characters or `.git` look-alikes."""
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty relative path")
        if "\0" in rel:
            raise ToolError("path contains a NUL byte")
        if not exact:
            bad = next((c for c in rel if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
            if bad is not None:
                raise ToolError(f"the path contains a control character (U+{ord(bad):04X}); file "
                                "names with control characters cannot be written through the "
                                "tools")
        if rel.startswith("/"):
            raise ToolError("absolute paths are refused: give a path relative to the repository")
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            raise ToolError("`..` is refused: paths stay inside the repository")
        if not parts:
            raise ToolError("path names the repository root, not a file")
        if not exact and any(dotgit(p) for p in parts):
            raise ToolError("paths inside .git (or names git treats as .git) are refused")
        return parts

    def for_read(self, rel: str) -> str:
        """Path for reading; symlinks are followed only while they stay in the workspace."""
        full = os.path.join(self.root, *self._parts(rel))
        real = os.path.realpath(full)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise ToolError(f"{rel} is a symlink that points outside the workspace: refused")
        return real

    def for_write(self, rel: str, exact: bool = False) -> str:
        """Path for writing or deleting: no component may be a symlink."""
        parts = self._parts(rel, exact)
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


_HFS_IGNORABLE = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                *range(0x206A, 0x2070), 0xFEFF])


def dotgit(name: str) -> bool:
    """Whether git treats this component as `.git` on some filesystem (case, HFS-ignorable
    characters, NTFS `git~1`, trailing dots and spaces, alternate streams)."""
    folded = name.translate(_HFS_IGNORABLE).casefold()
    if folded in (".git", "git~1"):
        return True
    if folded.startswith(".git"):
        rest = folded[4:]
        return rest.strip(". ") == "" or rest.startswith(":")
    return False


def regular_size(path: str, rel: str) -> int:
    """The size of a regular file; anything else (a FIFO, a socket, a device a build left) is
    refused rather than opened, which could block."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{rel} is not a regular file (a FIFO, socket or device); not opened")
    return info.st_size


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


def write_summary(rel: str, old: bytes | None, new: bytes) -> WriteResponse:
    """What a write did, fettle-style: `+N -M`, no-op detection, the diff for large rewrites."""
    new_text = decode_text(new)
    if old is not None and old == new:
        return WriteResponse("unchanged", f"no changes: {rel} already has this content")
    if new_text is None:
        verb = "Replaced" if old is not None else "Created"
        return WriteResponse("binary", f"{verb} binary file {rel} ({len(new)} bytes)")
    lines = new_text.count("\n") + (0 if new_text.endswith("\n") or not new_text else 1)
    size = f"{human_size(len(new))}, {lines} lines"
    old_text = decode_text(old) if old is not None else None
    if old is None:
        return WriteResponse("created", f"Created {rel} ({size})")
    if old_text is None:
        return WriteResponse("updated", f"Wrote {rel} ({size}; it was binary)")
    diff = list(difflib.unified_diff(old_text.splitlines(True), new_text.splitlines(True),
                                     "a/" + rel, "b/" + rel, n=3))
    added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
    removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
    summary = f"Wrote {rel} ({size}, +{added} -{removed})"
    changed = added + removed
    old_lines = max(1, old_text.count("\n"))
    shown = None
    if changed > DIFF_FLOOR and (changed >= DIFF_CEIL or changed / old_lines > DIFF_RATIO):
        shown = "".join(d if d.endswith("\n") else d + "\n\\ No newline at end of file\n"
                        for d in diff)
    return WriteResponse("updated", summary, added, removed, shown)


def read_page(handle: IO[bytes], offset: int | None, limit: int | None) -> Response | None:
    """One page of a text file with line numbers, read as a stream (a file of ten million
    lines costs one pass, not its size in memory): at most `limit` (and PAGE_LINES) lines and
    PAGE_BYTES bytes from line `offset`; a line longer than LINE_CHARS is cut, and says so.
    None when the file is binary (a NUL byte near the start, or a shown line not UTF-8)."""
    head = handle.read(PAGE_BYTES + 1)
    if b"\0" in head[:8192]:
        return None
    start = max(1, int(offset or 1))
    wanted = min(PAGE_LINES, max(1, int(limit))) if limit else PAGE_LINES
    if len(head) <= PAGE_BYTES:  # a small file (most): read at once
        rows: Iterable[bytes] = io.BytesIO(head)
    else:
        handle.seek(0)
        rows = handle
    out: list[str] = []
    size, end, total, full = 0, start - 1, 0, False
    for raw in rows:
        total += 1
        if total < start or full:
            continue
        try:
            line = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError:
            return None
        if len(line) > LINE_CHARS:
            line = line[:LINE_CHARS] + f" [... line cut: {len(line)} characters]"
        entry = f"{total:6d}\t{line}\n"
        if total >= start + wanted or (out and size + len(entry) > PAGE_BYTES):
            full = True
            continue
        out.append(entry)
        size += len(entry)
        end = total
    return {"text": "".join(out), "lines": total, "start": start, "end": end,
            "more": end < total}


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


def run_command(ws: Workspace, cmd: str, timeout: float, env: dict[str, str] | None
                ) -> RunResponse:
    start = time.monotonic()
    full_env = {**COMMAND_ENV, **(env or {})}
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", cmd], cwd=ws.root, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, preexec_fn=_prefer_oom_victim)
    except OSError as exc:
        raise ToolError(f"cannot start the command: {exc}") from None
    capture = OutputCapture()
    timed_out = _pump(proc, capture, start + timeout)
    if timed_out:
        kill_tree(proc)
    code = proc.wait()
    kill_tree(proc)  # nothing a command started outlives it
    _drain(proc, capture)
    return RunResponse(
        exit_code=code,
        timed_out=timed_out,
        output=capture.text(),
        total_bytes=capture.total,
        truncated=capture.truncated,
        seconds=round(time.monotonic() - start, 3),
    )


def _pump(proc: subprocess.Popen, capture: OutputCapture,  # type: ignore[type-arg]
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


def _drain(proc: subprocess.Popen, capture: OutputCapture) -> None:  # type: ignore[type-arg]
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


def isolation_problems(network: bool = True) -> list[str]:
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
    if is_dumpable():
        problems.append("the helper could not make itself non-dumpable")
    names = [name for _, name in socket.if_nameindex()]
    extra = [n for n in names if n != "lo"]
    if extra and network:
        problems.append(f"has network interfaces besides loopback: {', '.join(extra)}")
    return problems


def sandbox_state() -> dict[str, str]:
    """What the sandbox's uids can change that outlives their processes, and the processes
    themselves (but this one): each writable tmpfs's used blocks and files, and its root's owner,
    mode and extended attributes; the entries of each message-queue and pty file system; the
    SysV IPC objects; the sockets and flow labels of the network namespace. Counts only: the
    names are the commands' own."""
    state: dict[str, str] = {}
    for point, kind, writable in mounts():
        with contextlib.suppress(OSError):
            if kind == "tmpfs" and writable:
                fs, root = os.statvfs(point), os.stat(point)
                files = str(fs.f_files - fs.f_ffree) if fs.f_files else "uncounted"
                state[point] = (f"{fs.f_blocks - fs.f_bfree} blocks, {files} files, owner "
                                f"{root.st_uid}:{root.st_gid}, mode {root.st_mode:o}, "
                                f"{_attributes(point)} attributes")
            elif kind in ("mqueue", "devpts"):
                state[point] = f"{len(os.listdir(point))} entries"
    for kind in ("shm", "sem", "msg"):
        with contextlib.suppress(OSError), open(f"/proc/sysvipc/{kind}") as handle:
            state[f"SysV IPC {kind}"] = f"{len(handle.read().splitlines()) - 1} objects"
    for kind in NET_TABLES:  # in TIME_WAIT a closed listener's port stays bound, processless
        with contextlib.suppress(OSError), open(f"/proc/net/{kind}") as handle:
            state[f"/proc/net/{kind}"] = f"{len(handle.read().splitlines())} lines"
    me = str(os.getpid())
    state["processes"] = " ".join(sorted(n for n in os.listdir("/proc")
                                         if n.isdigit() and n != me))
    return state


def _attributes(path: str) -> int | str:
    """How many extended attributes `path` has (the commands' uid may set user.* ones on the
    workspace's root, which a wipe keeps)."""
    try:
        return len(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return "no"


def differences(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """How `now` differs from `before`; a tmpfs whose files cannot be counted always does."""
    left = [f"{key}: {now.get(key, 'gone')} (was {value})" for key, value in before.items()
            if now.get(key) != value]
    left += [f"{key}: {value} (new)" for key, value in now.items() if key not in before]
    left += [f"{key}: no inode limit, so its files cannot be counted" for key, value
             in now.items() if "uncounted" in value]
    return left


# --- requests -------------------------------------------------------------------------------


class Helper:
    def __init__(self, workspace: str, checks: bool, checks_network: bool = True) -> None:
        self.ws = Workspace(workspace)
        self.checks = checks
        self.checks_network = checks_network
        self.then: Callable[[IO[bytes]], None] | None = None  # streams after the answer
        # before any command of the sandbox ran; outside one (`checks` off) `reset` is refused
        self.started = sandbox_state() if checks else {}

    def op_hello(self, req: HelloRequest, payload: bytes) -> HelloResponse:
        problems = isolation_problems(self.checks_network) if self.checks else []
        return HelloResponse(uid=os.getuid(), python=sys.version.split()[0],
                             subreaper=become_subreaper(), dumpable=is_dumpable(),
                             problems=problems)

    def op_extract(self, req: ExtractRequest, payload: bytes | Chunks) -> ExtractResponse:
        """Unpack the tree that goes in, as it streams: fresh files only (O_EXCL), never through
        a symlink, names exactly as the repository has them. `record`: keep the names, for a
        setup's snapshot."""
        stream: IO[bytes] = io.BufferedReader(payload, 1 << 20) if isinstance(payload, Chunks) \
            else io.BytesIO(payload)
        count = 0
        names: list[str] = []
        made = {self.ws.root}  # directories this extraction made (so no symlink is among them)
        for kind, name, mode, link, size in tar_members(stream):
            if kind not in (b"0", b"\0", b"2"):
                skip(stream, size)
                continue
            parent = os.path.join(self.ws.root, *name.split("/")[:-1])
            leaf = name.rsplit("/", 1)[-1]
            if parent in made and leaf not in ("", ".", "..", ".git"):
                target = os.path.join(parent, leaf)
            else:
                target = self.ws.for_write(name, exact=True)
                make_dirs(os.path.dirname(target))
                made.add(os.path.dirname(target))
            if kind == b"2":
                skip(stream, size)
                os.symlink(link, target)
            else:
                write_new(stream, target, size, 0o775 if mode & 0o111 else 0o664)
            skip(stream, -size % 512)
            count += 1
            if req.record:
                names.append(name)
        if req.record:
            write_tree_list(names)
        return ExtractResponse(files=count)

    def op_reset(self, req: ResetRequest, payload: bytes) -> ResetResponse:
        """Once a tree's commands are done (each one's exec killed what it started), and again
        after the supervisor's `--wipe` when this finds something left: remove what this uid
        may of the scratch file systems (the tree it unpacked, what the commands wrote in its
        directories), then compare the sandbox with what it was at the start. Refused outside
        an isolated sandbox (the local backend's helper runs on the host)."""
        if not self.checks:
            raise ToolError("reset is for the Docker sandbox only: it empties every writable "
                            "tmpfs it sees")
        for point in scratch_mounts():
            clear(point)
            with contextlib.suppress(OSError):  # what the commands set on the workspace's root
                for name in os.listxattr(point, follow_symlinks=False):
                    if name.startswith("user."):
                        os.removexattr(point, name, follow_symlinks=False)
        left = differences(self.started, sandbox_state())
        deadline = time.monotonic() + SETTLE_S
        while left and all(item.startswith("/proc/net/") for item in left) \
                and time.monotonic() < deadline:  # closing: give the kernel a moment
            time.sleep(0.02)
            left = differences(self.started, sandbox_state())
        return ResetResponse(left=left)

    def op_read(self, req: ReadRequest, payload: bytes) -> ReadResponse:
        path = self.ws.for_read(req.path)
        if os.path.isdir(path):
            raise ToolError(f"{req.path} is a directory; use list_files")
        try:
            size = regular_size(path, req.path)
            if size > READ_MAX:
                raise ToolError(f"{req.path} is {human_size(size)}, too large to read "
                                f"(at most {human_size(READ_MAX)})")
            with open(path, "rb") as handle:
                page = read_page(handle, req.offset, req.limit)
        except FileNotFoundError:
            raise ToolError(f"{req.path} does not exist") from None
        if page is None:
            return ReadResponse(binary=True, size=size,
                                text=f"{req.path} is a binary file ({size} bytes); not shown")
        return ReadResponse(binary=False, size=size, **page)

    def op_write(self, req: WriteRequest, payload: bytes | Chunks) -> WriteResponse:
        if isinstance(payload, Chunks):  # a blob the host streams rather than holds
            payload = payload.readall()
        path = self.ws.for_write(req.path, exact=req.exact)
        if os.path.isdir(path):
            raise ToolError(f"{req.path} is a directory")
        if req.mode == "120000":
            return self._symlink(req.path, path, payload.decode("utf-8", "surrogateescape"))
        old = None
        if os.path.lexists(path):
            regular_size(path, req.path)  # never open a FIFO a build left: it would block
            with open(path, "rb") as handle:
                old = handle.read()
        result = write_summary(req.path, old, payload)
        mode = 0o775 if req.mode == "100755" else 0o664
        if result.status != "unchanged" or req.mode:
            make_dirs(os.path.dirname(path))
            self._atomic_write(path, payload, mode)
        return result

    def op_delete(self, req: DeleteRequest, payload: bytes) -> DeleteResponse:
        path = self.ws.for_write(req.path, exact=req.exact)
        if os.path.isdir(path):
            raise ToolError(f"{req.path} is a directory; delete the files in it")
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise ToolError(f"{req.path} does not exist") from None
        self._remove_empty_parents(path)
        return DeleteResponse(summary=f"Deleted {req.path}")

    def _remove_empty_parents(self, path: str) -> None:
        """As a checkout does: the folders the deletion left empty go too, up to the root (git
        keeps no empty folder, and a test may look for one). `rmdir` removes only an empty
        folder, never follows a symlink, and stops at the first that is not (a build's files
        stay)."""
        parent = os.path.dirname(path)
        while parent != self.ws.root and parent.startswith(self.ws.root + os.sep):
            try:
                os.rmdir(parent)
            except OSError:
                return
            parent = os.path.dirname(parent)

    def op_list(self, req: ListRequest, payload: bytes) -> ListResponse:
        base = self.ws.for_read(req.path) if req.path else self.ws.root
        found: list[str] = []
        omitted = 0
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            for name in sorted(filenames):
                if len(found) < LIST_MAX:
                    found.append(self.ws.relative(os.path.join(dirpath, name)))
                else:
                    omitted += 1
        if omitted:  # a build that made a million files cannot make one huge answer
            found.append(f"[... {omitted} more names not listed: list a subdirectory]")
        return ListResponse(files=found)

    def op_export(self, req: ExportRequest, payload: bytes) -> ExportResponse:
        """Copy-out: the files found now; their bytes follow the answer as frames
        (`send_files`)."""
        found = export_list(self.ws, req.paths)
        self.then = lambda out: send_files(out, found, req.max_size)
        return ExportResponse(files=len(found))

    def op_run(self, req: RunRequest, payload: bytes) -> RunResponse:
        return run_command(self.ws, req.cmd, req.timeout, req.env)

    @staticmethod
    def _symlink(rel: str, path: str, target: str) -> WriteResponse:
        tmp = f"{path}.retcon-tmp-{os.getpid()}"
        make_dirs(os.path.dirname(path))
        os.symlink(target, tmp)
        os.replace(tmp, path)
        return WriteResponse("created", f"Linked {rel} -> {target}")

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


# --- copy-out -------------------------------------------------------------------------------


def export_list(ws: Workspace, paths: list[str] | None) -> list[tuple[str, str, bool]]:
    """(name, full path, is a symlink) of each regular file and symlink at or under `paths`
    (the whole workspace by default), sorted, without `.git` directories, never through a
    symlink. Types come from the directory entries (no stat per file)."""
    found: dict[str, tuple[str, str, bool]] = {}
    todo: list[tuple[str, str]] = []  # (full path, name prefix)
    for rel in paths if paths is not None else [""]:
        if not rel:
            todo.append((ws.root, ""))
            continue
        parts = ws._parts(rel, exact=True)  # never through a symlink; the last may be one
        parent = ws.for_write("/".join(parts[:-1]), exact=True) if parts[1:] else ws.root
        full, name = os.path.join(parent, parts[-1]), "/".join(parts)
        try:
            mode = os.lstat(full).st_mode
        except FileNotFoundError:
            continue
        if dotgit(parts[-1]):
            continue
        if stat.S_ISDIR(mode):
            todo.append((full, name + "/"))
        elif stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            found[name] = (name, full, stat.S_ISLNK(mode))
    while todo:
        directory, prefix = todo.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if dotgit(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    todo.append((entry.path, prefix + entry.name + "/"))
                elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                    name = prefix + entry.name
                    found[name] = (name, entry.path, entry.is_symlink())
    return [found[name] for name in sorted(found)]


class Batched(io.RawIOBase):
    """Copy-out's frames gathered into blocks of at most EXPORT_BLOCK bytes, each sent as one
    write, compressed when that makes it smaller (see EXPORT_RAW in the protocol)."""

    RAW_AFTER_MISS = 8  # blocks sent raw, without trying, after one that did not shrink
    FIRST_BLOCK = 64 * 1024  # small first blocks, doubling: the host starts on them at once

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._buf = bytearray()
        self._raw = 0
        self._limit = self.FIRST_BLOCK

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self._buf and len(self._buf) + len(data) > self._limit:
            self.send()
        self._buf += data  # one frame: at most EXPORT_BLOCK
        if len(self._buf) >= self._limit:
            self.send()
        return len(data)

    def send(self) -> None:
        if not self._buf:
            return
        block = bytes(self._buf)
        self._buf.clear()
        self._limit = min(2 * self._limit, EXPORT_BLOCK)
        kind, body = EXPORT_RAW, block
        if self._raw:
            self._raw -= 1
        else:
            packed = zlib.compress(block, 1)
            if len(packed) < len(block) * 9 // 10:
                kind, body = EXPORT_PACKED, packed
            else:
                self._raw = self.RAW_AFTER_MISS
        self._out.write((len(body) + 1).to_bytes(4, "big") + kind)
        self._out.write(body)

    def flush(self) -> None:
        self.send()
        self._out.flush()


def send_files(stdout: IO[bytes], found: list[tuple[str, str, bool]], max_size: int) -> None:
    """The frames of copy-out: per file a header and its bytes, then an empty frame; a file
    that cannot be sent (gone, no longer regular, over `max_size`) ends the stream with an
    error frame that says why."""
    out = Batched(stdout)
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):  # fewer hand-offs
        fcntl.fcntl(stdout.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), EXPORT_CHUNK)
    try:
        for rel, full, link in found:
            name = os.fsencode(rel)
            if link:
                target = os.readlink(os.fsencode(full))
                out.write(export_header("120000", len(target), name))
                out.write(export_frame(EXPORT_DATA, target))
            else:
                send_file(out, full, name, max_size)
        out.write(b"\0\0\0\0")
    except (OSError, ToolError) as exc:
        out.write(export_frame(EXPORT_ERROR, f"{exc}".encode("utf-8", "replace")))
    finally:
        out.flush()


def send_file(out: Batched, full: str, name: bytes, max_size: int) -> None:
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        rel = os.fsdecode(name)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{rel} is no longer a regular file")
        if st.st_size > max_size:
            raise ToolError(f"{rel} is {human_size(st.st_size)}, over the largest file the "
                            f"host takes ({human_size(max_size)})")
        mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
        out.write(export_header(mode, st.st_size, name))
        left = st.st_size
        while left:
            block = os.read(fd, min(left, EXPORT_CHUNK))
            if not block:
                raise ToolError(f"{rel} shrank while it was copied out")
            out.write(export_frame(EXPORT_DATA, block))
            left -= len(block)
    finally:
        os.close(fd)


def _field(block: bytes, start: int, end: int) -> str:
    return block[start:end].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(block: bytes, start: int, end: int) -> int:
    if block[start] & 0x80:  # base-256, for sizes over 8 GiB
        return int.from_bytes(block[start + 1 : end], "big")
    digits = block[start:end].split(b"\0", 1)[0].strip()
    return int(digits, 8) if digits else 0


def tar_members(stream: IO[bytes]) -> Iterator[tuple[bytes, str, int, str, int]]:
    """(type, name, mode, link target, size) of each member of the ustar/PAX tar stream the host
    sends; the caller reads the member's `size` bytes and its padding before asking for the next.
    A small reader: tarfile costs more than creating the files, on a 5,000-file tree."""
    pax: dict[str, str] = {}
    while True:
        block = read_exactly(stream, 512)
        if not block.strip(b"\0"):
            return
        kind = block[156:157]
        size = _number(block, 124, 136)
        if kind in (b"x", b"L", b"K"):
            data = read_exactly(stream, size)
            skip(stream, -size % 512)
            if kind == b"x":
                pax.update(_pax_records(data))
            else:
                pax["path" if kind == b"L" else "linkpath"] = _field(data, 0, len(data))
            continue
        name = _field(block, 0, 100)
        if block[257:262] == b"ustar" and block[345] != 0:
            name = _field(block, 345, 500) + "/" + name
        name = pax.get("path", name)
        link = pax.get("linkpath", _field(block, 157, 257))
        size = int(pax.get("size", size))
        pax = {}
        yield kind, name, _number(block, 100, 108), link, size


def _pax_records(data: bytes) -> dict[str, str]:
    """`LEN key=value\n` records; values that are not UTF-8 (hdrcharset=BINARY) kept as bytes
    through surrogateescape, as names are."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        found[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return found


def write_new(stream: IO[bytes], target: str, size: int, mode: int) -> None:
    """A new file of `size` bytes from the stream: open, write, close (the system calls are what
    copy-in costs in a container)."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        while size:
            block = stream.read(min(size, 1 << 20))
            if not block:
                raise EOFError("the tree ended inside a file")
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view):]
            size -= len(block)
    finally:
        os.close(fd)


def skip(stream: IO[bytes], size: int) -> None:
    if size:
        read_exactly(stream, size)


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


class Chunks(io.RawIOBase):
    """A chunked payload as a stream: frames of a 4-byte big-endian length and that many
    bytes, up to an empty frame."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._left = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._left == 0 and not self._done:
            self._left = int.from_bytes(read_exactly(self._stream, 4), "big")
            self._done = self._left == 0
        if self._done:
            return 0
        data = self._stream.read(min(len(buffer), self._left))
        if not data:
            raise EOFError("stdin closed inside a chunked payload")
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def drain(self) -> None:
        """Skip what the handler did not read, so the next request line is found."""
        while self.readinto(bytearray(1 << 16)):
            pass


def handle(helper: Helper, req: Response, stdin: IO[bytes]) -> Response:
    payload: bytes | Chunks = b""
    if req.get("chunked"):
        payload = Chunks(stdin)
    elif req.get("payload"):
        payload = read_exactly(stdin, int(req["payload"]))
    try:
        op = req.get("op")
        kind = REQUESTS.get(op) if isinstance(op, str) else None
        if kind is None:
            raise ToolError(f"unknown operation {op!r}")
        request = from_wire(kind, {k: v for k, v in req.items()
                                   if k not in ("id", "op", "payload", "chunked")})
        handler: Callable[[Any, Any], Any] = getattr(helper, "op_" + kind.OP)
        response: Response = {"ok": True}
        response.update(to_wire(handler(request, payload)))
        return response
    finally:
        if isinstance(payload, Chunks):
            payload.drain()


def serve(helper: Helper, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    while True:
        line = stdin.readline()
        if not line:
            return
        req: Response = {}
        response: Response
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                req = {}
                raise ToolError("bad request: expected a JSON object")
            response = handle(helper, req, stdin)
        except ToolError as exc:
            response = {"ok": False, "error": str(exc)}
        except OSError as exc:
            response = {"ok": False, "error": f"{req.get('path', 'io')}: {exc.strerror}"}
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            response = {"ok": False, "error": f"bad request: {exc}"}
        except RecursionError:
            response = {"ok": False, "error": "a path or structure is nested too deeply"}
        except EOFError:  # the host closed our input: nothing more to answer
            return
        response["id"] = req.get("id") if isinstance(req, dict) else None
        stdout.write(json.dumps(response).encode() + b"\n")
        then, helper.then = helper.then, None
        if then is not None and response.get("ok"):
            stdout.flush()
            then(stdout)
        stdout.flush()


def write_tree_list(names: list[str]) -> None:
    """The names a setup's tree brought, in a file only the helper's uid can read or write
    (0600, created fresh, never through a symlink): setup's commands run as another uid."""
    try:
        fd = os.open(TREE_LIST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ToolError(f"cannot create the tree list {TREE_LIST}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(fd, 0o600)
        handle.write("\0".join(names).encode("utf-8", "surrogateescape"))


def main(argv: list[str]) -> None:
    workspace, checks, checks_network = "/workspace", True, True
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--workspace":
            workspace = args.pop(0)
        elif arg == "--no-isolation-checks":
            checks = False
        elif arg == "--network-allowed":  # a setup container: its network is the point
            checks_network = False
    # started by a run's thread that leaves these to the run's main thread (the local helper),
    # the mask is inherited: the commands started here must get them
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    harden()
    make_dirs(workspace)
    with contextlib.suppress(OSError):  # shared with the commands' uid through the group
        os.chmod(workspace, 0o2775)
    serve(Helper(workspace, checks, checks_network), sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main(sys.argv[1:])
