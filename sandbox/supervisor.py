"""retcon-sandbox's supervised modes, each in a `docker exec` of its own. Standard library only;
Python 3.8+.

Started as `python3 -I -S -c <this file> MODE ...` (the system interpreter, as for the helper),
with RETCON_SANDBOX_SUPERVISE=1 (it kills every process of its uid: never on a host):

- `--run TIMEOUT COMMAND`: one build or test command, under the commands' uid (`supervise`);
- `--prepare [--git [--index SIZE]] [--tag TAG [--distance N]]`: the workspace's git metadata
  and what a setup left, under the commands' uid, which then owns them (`prepare`); with
  `--index`, the tree's entries (SIZE bytes of `update-index -z --index-info` records) come on
  stdin; followed by `--run TIMEOUT COMMAND`, the same in the command's exec, just before it
  (one exec less per tree);
- `--snapshot`: after a setup, keep what it made in the workspace, under the helper's uid
  (`snapshot`);
- `--wipe`: before a used sandbox takes another tree, under the commands' uid: end every
  process of that uid and remove what it may of every writable scratch file system (`wipe`).
  The helper then removes the rest and checks that the sandbox is as it started (`reset`).

It is kept apart from the helper, which inlines it (see `resources.helper_source`), because it
starts in every command's exec: it imports only os, sys, signal, stat, time and ctypes, and
starts its children with fork and exec, where the helper's protocol and `subprocess` would cost
about as much CPU again as the exec itself (see bench/sandbox_overhead.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os
import signal
import stat
import sys
import time
from collections.abc import Iterable, Iterator

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What every build, test and setup command starts with, before the variables it is given.
COMMAND_ENV = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
PREPARED = "/var/tmp/retcon-prepared"  # what setup left in the workspace, kept in its image
TREE_LIST = "/tmp/retcon-tree-files"  # the names a setup's tree brought (NUL-separated)
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "retcon-sandbox", "GIT_COMMITTER_NAME": "retcon-sandbox",
                "GIT_AUTHOR_EMAIL": "retcon-sandbox@localhost",
                "GIT_COMMITTER_EMAIL": "retcon-sandbox@localhost",
                "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
                "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}
PR_SET_DUMPABLE = 4
TIMED_OUT = 124
MAX_DISTANCE = 1_000_000
SCRATCH = ("tmpfs", "mqueue")  # the writable file systems a sandbox's uids may write to
MAX_DEPTH = 256  # how deep `clear` goes: what lies deeper stays (and the sandbox is not reused)
PREPARED_RECORD = "retcon-sandbox-prepared"  # stderr, after `prepare_first`: code, seconds, why
# (hex of UTF-8); the host reads it apart from the output (backends/docker/sandboxes.py)
PREPARE_S = 60.0  # the longest the git metadata may take (the host waits 15 s more)
WAKE_S = 0.25  # the longest `wait` sleeps before it looks at its child again
GONE_S = 5.0  # the longest `wipe` waits for the killed processes to be reaped
TYPE_CHECKING = False  # no `typing` import: it would cost every command's exec
if TYPE_CHECKING:  # `--prepare`'s: git metadata or not, the tag, the distance, the tree's entries
    Prepared = tuple[bool, str | None, int, bytes]


def make_dirs(path: str) -> None:
    """os.makedirs without recursion (a path may be a thousand directories deep)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _prefer_oom_victim() -> None:
    """In the child: be the out-of-memory killer's first choice, not the helper."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("1000")


def is_dumpable() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
    except (OSError, AttributeError):
        return True


def harden() -> None:
    """Non-dumpable: /proc/<pid>/fd, mem and ptrace are closed to every other process of the
    container; and files are made group-writable, for the commands' uid that shares the group."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.umask(0o002)


# --- children, by fork and exec ---------------------------------------------------------------


def spawn(argv: list[str], cwd: str, env: dict[str, str], stdin: int, out: int) -> int:
    """Start `argv` (an absolute program, or one found on env's PATH) in a session of its own,
    with the signal dispositions a shell gives (Python ignores SIGPIPE and SIGXFSZ: a pipe into
    `head` would fail otherwise), the out-of-memory killer's first choice, stdin from the
    descriptor `stdin`, stdout and stderr to `out`: its pid. A program that cannot start
    writes why to `out` and exits 127. OSError when no process can be made."""
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may return into the caller's code
        for number in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.setsid()
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        _prefer_oom_victim()
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:  # reported, then the child ends
        with contextlib.suppress(BaseException):
            os.write(1, f"retcon-sandbox: cannot start {argv[0]}: {exc}\n".encode())
    os._exit(127)


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def wait(pid: int, timeout: float | None = None) -> int | None:
    """The child's exit code (`exit_code`), or None when `timeout` seconds passed first. No
    signal handler: SIGCHLD is waited for while blocked (a stray one, which the commands' uid
    may send, only wakes the loop), so nothing a command sends can cut the supervisor short
    of its clean-up. Each wait lasts at most WAKE_S: in a process with other threads (a test
    calling this), the kernel may hand the child's SIGCHLD to a thread that does not block
    it, and this one would sleep to the deadline."""
    if timeout is None:
        return exit_code(os.waitpid(pid, 0)[1])
    deadline = time.monotonic() + timeout
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return exit_code(status)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            signal.sigtimedwait([signal.SIGCHLD], min(left, WAKE_S))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def supervise(cmd: str, timeout: float, workspace: str,
              prepared: Prepared | None = None) -> int:
    """`--run`: run one command for the host, in its own `docker exec` under the commands' uid.
    Its output goes straight to this exec's stdout (the host reads and caps it); the exit code
    is the command's, or 124 on timeout. Afterwards every process of this uid but this one is
    killed (kill(-1)), so nothing a command started outlives it, however it detached or traced
    itself. Non-dumpable, so the command cannot trace this process or reach its pipes.
    `prepared`: `prepare` first; when that fails, the output says so first, and the command
    runs all the same (as it does after a `--prepare` exec that failed)."""
    harden()
    if prepared is not None:
        prepare_first(workspace, prepared)
    env = {**COMMAND_ENV, **os.environ}
    try:
        with open(os.devnull, "rb") as nothing:
            code = wait(spawn(["/bin/sh", "-c", cmd], workspace, env, nothing.fileno(), 1),
                        timeout)
    except OSError as exc:  # no process could be made (the pids limit, memory)
        sys.stdout.write(f"retcon-sandbox: cannot start the command: {exc}\n")
        code = 127
    finally:
        end_the_rest()
    return TIMED_OUT if code is None else code


def end_the_rest() -> None:
    """Kill every process of this uid but this one (kill(-1)), and reap this one's children."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    reap()


def _scratch(name: str) -> int:
    """A file with no name, in memory (or in /tmp where memfd_create is missing)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name)
    return os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)


def run_git(args: list[str], workspace: str, env: dict[str, str], feed: bytes | None,
            deadline: float, kept: bytearray | None = None) -> int:
    """One git command in the workspace (no hooks, no signing, no background gc), `feed` on its
    stdin: its exit code, after writing its output (the last 2000 bytes) when it failed; 124
    when it was not done by `deadline` (then it and its session are killed). `kept`: where its
    output (the first 2000 bytes: an object's name) goes when it succeeded. Input and output
    go through unnamed files, so neither side can block the other."""
    argv = ["git", "-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null",
            "-c", "commit.gpgSign=false", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
            *args]
    with contextlib.ExitStack() as stack:
        try:
            stdin = _scratch("git-in") if feed else os.open(os.devnull, os.O_RDONLY)
            stack.callback(os.close, stdin)
            view = memoryview(feed or b"")
            while view:
                view = view[os.write(stdin, view):]
            os.lseek(stdin, 0, os.SEEK_SET)
            out = _scratch("git-out")
            stack.callback(os.close, out)
            pid = spawn(argv, workspace, env, stdin, out)
            code = wait(pid, max(0.0, deadline - time.monotonic()))
            if code is None:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                wait(pid)
                sys.stdout.write(f"git {args[0]}: not done within {PREPARE_S:.0f} s\n")
                return TIMED_OUT
            size = os.lseek(out, 0, os.SEEK_END)
            os.lseek(out, 0 if kept is not None and not code else max(0, size - 2000),
                     os.SEEK_SET)
            said = os.read(out, 2000)
        except OSError as exc:
            sys.stdout.write(f"git {args[0]}: {exc}\n")
            return 127
        if code:
            sys.stdout.write(said.decode("utf-8", "replace"))
        elif kept is not None:
            kept += said
        return code or 0


def make_git(workspace: str, tag: str | None, distance: int = 0, listing: bytes = b"") -> int:
    """`--prepare --git`: the workspace as a git repository whose last commit holds the tree, so
    setuptools-scm and hatch-vcs find a version, and a test that asks git sees what a checkout
    of the tree shows: its HEAD, index and refs, a clean status. The commit's tree is the one
    `listing` gives (the tree's `update-index -z --index-info` records, from the host): every
    entry as the tree has it, submodules and files a .gitignore names too, its blobs hashed
    from the workspace's bytes as they are (no filter; `write_blobs`). A git metadata made
    before (for the tree a sandbox held before its files changed in place) is replaced, so a
    sandbox whose tree changed holds the same repository as one opened on the new tree.
    With `tag`, `git describe --tags --long` gives `tag-<distance>-g<hash>` as a checkout of
    the commit would: the tag is on a root commit with `distance - 1` empty commits over it
    (one `git fast-import`), the tree's commit on top; the hash is of these synthetic commits.
    Runs as the commands' uid, which owns it; git from the system's directories (not one a
    setup put first on the image's PATH, in a virtual environment the commands' uid owns),
    within PREPARE_S seconds in all."""
    env = {"HOME": "/tmp", **os.environ, "PATH": DEFAULT_PATH, **GIT_IDENTITY}
    deadline = time.monotonic() + PREPARE_S
    algorithm = "sha256" if len(listing.split(b"\t", 1)[0]) > 50 else "sha1"
    try:
        remove(os.path.join(workspace, ".git"))
    except OSError as exc:
        sys.stdout.write(f"the git metadata made before cannot be removed: {exc}\n")
        return 1
    steps: list[tuple[list[str], bytes | None]] = [
        (["init", "-q", f"--object-format={algorithm}"], None)]
    if tag and 0 < distance <= MAX_DISTANCE:
        steps.append((["fast-import", "--quiet"], _history(tag, distance)))
    steps.append((["update-index", "-z", "--index-info"], listing))
    for step, feed in steps:
        code = run_git(step, workspace, env, feed, deadline)
        if code:
            return code
    try:
        write_blobs(workspace, listing, algorithm)
    except OSError as exc:
        sys.stdout.write(f"git's objects cannot be written: {exc}\n")
        return 1
    run_git(["update-index", "-q", "--refresh"], workspace, env, None, deadline)  # stat data
    return _commit(workspace, env, tag, distance, deadline)


def _commit(workspace: str, env: dict[str, str], tag: str | None, distance: int,
            deadline: float) -> int:
    """The index as the tree's commit, on the synthetic history if any, and the tag. A blob a
    command changed since its tree was loaded is not in git's objects (`--missing-ok`): the
    status shows that file as modified, as it is."""
    tree, commit = bytearray(), bytearray()
    code = run_git(["write-tree", "--missing-ok"], workspace, env, None, deadline, tree)
    parent = ["-p", "refs/heads/main"] if tag and 0 < distance <= MAX_DISTANCE else []
    code = code or run_git(["commit-tree", tree.decode().strip(), *parent, "-m",
                            "the tree under test"], workspace, env, None, deadline, commit)
    code = code or run_git(["update-ref", "-m", "commit: the tree under test", "HEAD",
                            commit.decode().strip()], workspace, env, None, deadline)
    if not code and tag and not 0 < distance <= MAX_DISTANCE:
        code = run_git(["tag", tag], workspace, env, None, deadline)
    return code


BLOB_MODES = (b"100644", b"100755", b"120000")
PACK_LIMIT = 1 << 31  # a pack's objects start below this (idx v2's 4-byte offsets); then another


def write_blobs(workspace: str, listing: bytes, algorithm: str) -> None:
    """Each regular file's and symlink's blob of `listing`, from the workspace's bytes exactly
    (what `git hash-object --no-filters` writes): only when they still hash to the tree's blob
    (a file a command changed is left out, see `_commit`). In a pack (`Pack`), not as loose
    objects: on fuse-overlayfs, making a file and later removing it costs milliseconds, and a
    loose object per blob cost 0.4 to 0.7 s per tree of 100 to 200 files, in every commit's
    exec. Each submodule's folder, empty, where the workspace has nothing."""
    root = os.fsencode(workspace)
    pack = Pack(os.path.join(workspace, ".git", "objects", "pack"), algorithm)
    written: set[bytes] = set()
    try:
        for record in listing.split(b"\0"):
            meta, _, path = record.partition(b"\t")
            mode, _, sha = meta.partition(b" ")
            if mode == b"160000":  # a submodule, not checked out: an empty folder, as in a checkout
                with contextlib.suppress(OSError):
                    make_dirs(os.fsdecode(os.path.join(root, path)))
            if mode not in BLOB_MODES or sha in written:
                continue
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                if _add_blob(pack, os.path.join(root, path), mode == b"120000",
                             sha.decode("ascii", "replace")):
                    written.add(sha)
    except BaseException:
        pack.discard()
        raise
    pack.finish()


def _add_blob(pack: Pack, full: bytes, link: bool, name: str) -> bool:
    if link:
        target = os.readlink(full)
        return pack.add([target], len(target), name)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:  # a symlink or a folder now, where the tree has a file
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            return False
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        return stat.S_ISREG(info.st_mode) and pack.add(
            iter(lambda: handle.read(1 << 20), b""), info.st_size, name)


class Pack:
    """Blobs written as git packs (version 2, each with its version-2 index), another begun
    once one reaches PACK_LIMIT bytes. A blob is kept only when its bytes hash to its name."""

    def __init__(self, folder: str, algorithm: str) -> None:
        self.folder, self.algorithm = folder, algorithm
        self.temporary = os.path.join(folder, f"tmp-{os.getpid()}.pack")
        self.out: io.BufferedRandom | None = None
        self.entries: list[tuple[bytes, int, int]] = []  # name, CRC-32 of its bytes, offset

    def add(self, blocks: Iterable[bytes], size: int, name: str) -> bool:
        import hashlib
        import zlib

        if self.out is None or self.out.tell() >= PACK_LIMIT:
            self.finish()
            make_dirs(self.folder)
            self.out = open(self.temporary, "w+b")  # noqa: SIM115 (closed by finish or discard)
            self.out.write(b"PACK\0\0\0\2\0\0\0\0")  # the count is written by finish
        out, offset = self.out, self.out.tell()
        digest, packer = hashlib.new(self.algorithm), zlib.compressobj(1)
        digest.update(b"blob %d\0" % size)
        head = _object_header(3, size)  # 3: a blob
        out.write(head)
        crc, seen = zlib.crc32(head), 0
        for block in blocks:
            seen += len(block)
            digest.update(block)
            data = packer.compress(block)
            crc = zlib.crc32(data, crc)
            out.write(data)
        data = packer.flush()
        out.write(data)
        if seen != size or digest.hexdigest() != name:
            out.seek(offset)
            out.truncate()
            return False
        self.entries.append((bytes.fromhex(name), zlib.crc32(data, crc), offset))
        return True

    def finish(self) -> None:
        """The pack so far, with its count and hash, and its index: under git's names."""
        import hashlib

        out, self.out = self.out, None
        if out is None:
            return
        entries, self.entries = sorted(self.entries), []
        with out:
            if not entries:
                os.unlink(self.temporary)
                return
            out.seek(8)
            out.write(len(entries).to_bytes(4, "big"))
            out.seek(0)
            digest = hashlib.new(self.algorithm)
            for block in iter(lambda: out.read(1 << 20), b""):
                digest.update(block)
            trailer = digest.digest()
            out.write(trailer)
        name = os.path.join(self.folder, f"pack-{trailer.hex()}")
        os.chmod(self.temporary, 0o444)
        os.replace(self.temporary, f"{name}.pack")
        index = _pack_index(entries, trailer, self.algorithm)
        with open(self.temporary, "wb") as written:
            written.write(index)
        os.chmod(self.temporary, 0o444)
        os.replace(self.temporary, f"{name}.idx")

    def discard(self) -> None:
        out, self.out = self.out, None
        if out is not None:
            out.close()
            os.unlink(self.temporary)


def _object_header(kind: int, size: int) -> bytes:
    """A packed object's type and inflated size: 4 bits of size, then 7 a byte."""
    head = bytearray([kind << 4 | size & 15])
    size >>= 4
    while size:
        head[-1] |= 0x80
        head.append(size & 0x7F)
        size >>= 7
    return bytes(head)


def _pack_index(entries: list[tuple[bytes, int, int]], trailer: bytes, algorithm: str) -> bytes:
    """A pack's version-2 index: `entries` (name, CRC-32, offset) sorted by name."""
    import hashlib

    counts = [0] * 256
    for name, _, _ in entries:
        counts[name[0]] += 1
    fanout, running = bytearray(), 0
    for count in counts:
        running += count
        fanout += running.to_bytes(4, "big")
    index = b"".join([b"\377tOc\0\0\0\2", fanout, *(n for n, _, _ in entries),
                      *(c.to_bytes(4, "big") for _, c, _ in entries),
                      *(o.to_bytes(4, "big") for _, _, o in entries), trailer])
    return index + hashlib.new(algorithm, index).digest()


def remove(path: str) -> None:
    """Remove `path`, whatever it is, never through a symlink (a folder: `clear`, then it)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        clear(path)
        os.rmdir(path)
    else:
        os.unlink(path)


def _history(tag: str, distance: int) -> bytes:
    """A `git fast-import` stream: `distance` empty commits on main, the first tagged `tag`."""
    who = "retcon-sandbox <retcon-sandbox@localhost> 946684800 +0000"
    message = b"synthetic history: the distance from the tag\n"
    commit = (f"commit refs/heads/main\ncommitter {who}\ndata {len(message)}\n".encode()
              + message + b"\n")
    first = commit.replace(b"\ncommitter", b"\nmark :1\ncommitter", 1)
    return first + commit * (distance - 1) + f"reset refs/tags/{tag}\nfrom :1\n\n".encode()


# --- the environment a setup prepared -------------------------------------------------------


def _copy_entry(src: str, dst: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode):
        with open(src, "rb") as reader:
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         (st.st_mode & 0o777) | 0o660)
            with os.fdopen(fd, "wb") as writer:
                while block := reader.read(1 << 20):
                    writer.write(block)


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk(top)`, top-down, errors ignored, never into a symlink, but without recursion:
    before Python 3.12 it recursed once per level, and a tree a setup left deep enough ended it
    (RecursionError). The caller may prune the names of directories it is given."""
    todo = [top]
    while todo:
        dirpath = todo.pop()
        try:
            with os.scandir(dirpath) as listing:
                entries = [(entry.name, entry.is_dir()) for entry in listing]
        except OSError:
            continue
        dirnames = [name for name, is_dir in entries if is_dir]
        yield dirpath, dirnames, [name for name, is_dir in entries if not is_dir]
        todo += [path for name in reversed(dirnames)
                 if not os.path.islink(path := os.path.join(dirpath, name))]


def copy_tree(src_root: str, dst_root: str, skip_names: set[str]) -> int:
    """Copy files and symlinks under `src_root` that are not in `skip_names` (relative names)
    and do not exist at the destination; never through a symlink; `.git` at the top is left."""
    copied = 0
    for dirpath, dirnames, filenames in walk(src_root):
        rel_dir = os.path.relpath(dirpath, src_root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        target_dir = os.path.join(dst_root, rel_dir)
        if os.path.islink(target_dir.rstrip("/")) or not _is_dir_or_make(target_dir):
            dirnames[:] = []
            continue
        entries = [(n, True) for n in dirnames] + [(n, False) for n in filenames]
        dirnames[:] = [n for n in dirnames if not os.path.islink(os.path.join(dirpath, n))
                       and not (rel_dir == "" and n == ".git")]
        for name, is_dir in entries:
            rel = rel_dir + name
            src = os.path.join(dirpath, name)
            st = os.lstat(src)
            if (is_dir and not stat.S_ISLNK(st.st_mode)) or rel in skip_names \
                    or (rel_dir == "" and name == ".git"):
                continue
            if os.path.lexists(os.path.join(target_dir, name)):
                continue
            _copy_entry(src, os.path.join(target_dir, name), st)
            copied += 1
    return copied


def _is_dir_or_make(path: str) -> bool:
    if os.path.isdir(path):
        return True
    if os.path.lexists(path):
        return False
    make_dirs(path)
    return True


def read_tree_list() -> set[str]:
    """The tree list, only if this uid wrote it and nobody else can have changed it."""
    fd = os.open(TREE_LIST, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
            raise OSError(f"{TREE_LIST} is not the helper's own (uid {st.st_uid}, mode "
                          f"{stat.S_IMODE(st.st_mode):o})")
        return set(handle.read().decode("utf-8", "surrogateescape").split("\0"))


def snapshot(workspace: str) -> int:
    """`--snapshot` (as the helper's uid, which alone reads the tree list): after a setup,
    keep what it added to the workspace (node_modules, build metadata, ...) in PREPARED, so
    the image made from this container carries it."""
    try:
        names = read_tree_list()
    except OSError as exc:
        sys.stdout.write(f"the tree list cannot be trusted: {exc}\n")
        return 1
    make_dirs(PREPARED)
    if os.path.islink(PREPARED) or os.lstat(PREPARED).st_uid != os.getuid():
        sys.stdout.write(f"{PREPARED} was made by setup, not by the helper\n")
        return 1
    sys.stdout.write(f"kept {copy_tree(workspace, PREPARED, names)} files setup made\n")
    return 0


def prepare(workspace: str, git: bool, tag: str | None, distance: int = 0,
            listing: bytes = b"") -> int:
    """`--prepare`: the git metadata, then what a setup left (never over the tree's files)."""
    if git and (code := make_git(workspace, tag, distance, listing)):
        return code
    if os.path.isdir(PREPARED):
        copy_tree(PREPARED, workspace, set())
    return 0


def prepare_first(workspace: str, prepared: Prepared) -> None:
    """`prepare` in a command's exec, before it. Whatever it meets (a tree a setup left too deep
    to copy, no room for git's objects), the command runs all the same, as after a `--prepare`
    exec that failed: its output says first why the workspace was not made ready. Then one line
    on this exec's stderr, which the command cannot reach (see `PREPARED_RECORD`)."""
    started = time.monotonic()
    real, sys.stdout = sys.stdout, io.StringIO()  # what `prepare` writes: git's complaint
    try:
        failed = prepare(workspace, *prepared)
    except BaseException as exc:  # the command runs, whatever it was (SIGINT from a git
        sys.stdout.write(f"{type(exc).__name__}: {exc}\n")  # a setup planted, too)
        failed = 1
    finally:
        captured, sys.stdout = sys.stdout, real
    why = captured.getvalue() if isinstance(captured, io.StringIO) else ""
    if failed:
        sys.stdout.write(f"{why}retcon-sandbox: the workspace could not be made a git "
                         f"repository (exit {failed}); set [sandbox] git_metadata = false if "
                         "the project needs none\n")
    sys.stdout.flush()
    seconds = time.monotonic() - started
    why_hex = why[-300:].encode("utf-8", "replace").hex()
    with contextlib.suppress(OSError):
        os.write(2, f"{PREPARED_RECORD} {failed} {seconds:.3f} {why_hex}\n".encode())


# --- wiping a used sandbox ------------------------------------------------------------------


def mounts() -> list[tuple[str, str, bool]]:
    """Each mount this process sees: (mount point, file system type, writable)."""
    found = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle.read().decode("utf-8", "surrogateescape").splitlines():
            fields = line.split(" ")
            if "-" not in fields[6:]:
                continue
            separator = fields.index("-", 6)
            found.append((_unescaped(fields[4]), fields[separator + 1],
                          "rw" in fields[5].split(",")))
    return found


def _unescaped(field: str) -> str:
    """A mountinfo field: the kernel writes space, tab, newline and backslash as \\ooo."""
    parts = field.split("\\")
    return parts[0] + "".join(chr(int(p[:3], 8)) + p[3:] for p in parts[1:])


def scratch_mounts() -> list[str]:
    return [point for point, kind, writable in mounts() if kind in SCRATCH and writable]


def others_of_my_uid() -> list[int]:
    """The processes of this uid but this one (zombies too, until they are reaped)."""
    me, uid = os.getpid(), os.getuid()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
    return found


def clear(top: str) -> None:
    """Remove what this uid may of everything under `top` (never `top` itself), staying on its
    file system and never through a symlink; its own directories are opened up first, whatever
    their modes. What it may not remove stays: the helper's check finds it."""
    with contextlib.suppress(OSError):
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            _clear_in(fd, os.fstat(fd).st_dev, 0)
        finally:
            os.close(fd)


def _clear_in(fd: int, device: int, depth: int) -> None:
    with os.scandir(fd) as listing:
        entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, is_dir in entries:
        with contextlib.suppress(OSError):
            if is_dir:
                if depth >= MAX_DEPTH or not _clear_dir(fd, name, device, depth + 1):
                    continue
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)


def _clear_dir(parent: int, name: str, device: int, depth: int) -> bool:
    """Empty the directory `name`: False when it is another mount (left as it is)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except PermissionError:  # one of ours made unreadable: no process of this uid is left to
        os.chmod(name, 0o700, dir_fd=parent)  # swap it for a symlink meanwhile
        fd = os.open(name, flags, dir_fd=parent)
    try:
        st = os.fstat(fd)
        if st.st_dev != device:
            return False
        if st.st_uid == os.getuid():
            os.fchmod(fd, 0o700)
        _clear_in(fd, device, depth)
        return True
    finally:
        os.close(fd)


def wipe() -> int:
    """`--wipe`, under the commands' uid: SIGKILL every other process of this uid and wait
    until they are reaped, then `clear` each writable scratch file system (the workspace, /tmp,
    /dev/shm, the message queues, the tmpfs over the image's volumes). 1 when a process is
    left."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    deadline = time.monotonic() + GONE_S
    while others_of_my_uid():
        if time.monotonic() > deadline:
            sys.stdout.write("retcon-sandbox: processes of the commands' uid are left\n")
            return 1
        time.sleep(0.002)
    for point in scratch_mounts():
        clear(point)
    return 0


def supervised(args: list[str], workspace: str = "/workspace") -> None:
    if os.environ.get("RETCON_SANDBOX_SUPERVISE") != "1":  # kill(-1): never on a host
        sys.exit("the supervised modes are for the Docker sandbox only")
    mode = args.pop(0) if args else ""
    sys.stdout.flush()
    prepared = read_listing(*prepare_options(args)) if mode == "--prepare" else None
    if prepared is not None and args[:1] == ["--run"]:
        mode = args.pop(0)
    if mode == "--run":
        timeout = float(args.pop(0))
        sys.exit(supervise(args.pop(0), timeout, workspace, prepared))
    os.umask(0o002)
    if mode == "--snapshot":
        sys.exit(snapshot(workspace))
    if mode == "--wipe":
        sys.exit(wipe())
    if prepared is None or args:
        sys.exit(f"unknown mode {mode!r}: --run, --prepare, --snapshot or --wipe")
    try:
        code = prepare(workspace, *prepared)
    finally:  # nothing its git started is left for the command's exec (as after `--run`)
        end_the_rest()
    sys.exit(code)


def prepare_options(args: list[str]) -> tuple[bool, str | None, int, int]:
    """`--prepare`'s options (`--git`, `--index SIZE`, `--tag TAG`, `--distance N`, in this
    order), taken from the front of `args`, so that a tag's name is never read as an option."""
    git, tag, distance, size = False, None, 0, 0
    if args[:1] == ["--git"]:
        git = bool(args.pop(0))
    if args[:1] == ["--index"] and len(args) > 1:
        size = int(args[1])
        del args[:2]
    if args[:1] == ["--tag"] and len(args) > 1:
        tag = args[1]
        del args[:2]
    if args[:1] == ["--distance"] and len(args) > 1:
        distance = int(args[1])
        del args[:2]
    return git, tag, distance, size


def read_listing(git: bool, tag: str | None, distance: int, size: int) -> Prepared:
    """The tree's entries, `size` bytes on stdin (the host sends them as the exec starts)."""
    data = bytearray()
    while len(data) < size:
        block = os.read(0, min(size - len(data), 1 << 20))
        if not block:
            break
        data += block
    return git, tag, distance, bytes(data)


if __name__ == "__main__":
    supervised(sys.argv[1:])
