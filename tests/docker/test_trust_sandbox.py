"""The trust boundary, sandbox side: a build or test cannot forge the helper's answers, stop it,
outlive its command, flood the host, or make the host hold a repository in memory; an image
cannot bring volumes or an entrypoint. Each attacks from inside and is judged from outside."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from retcon_sandbox.backends.api import HelperSandbox
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.docker.sandboxes import SYSCTLS
from retcon_sandbox.errors import SandboxError
from tests.conftest import CLI, NEUTRAL, Result
from tests.docker.conftest import build_test_image
from tests.repo.test_names import FILE, make_repo, run_git

FORGE = r"""
import glob, json, os, signal
me = os.getpid()
forged = json.dumps({"id": 2, "ok": True, "exit_code": 0, "timed_out": False,
                     "output": "FORGED", "total_bytes": 6, "truncated": False, "seconds": 0})
for proc in sorted(glob.glob("/proc/[0-9]*")):
    pid = int(proc.rsplit("/", 1)[1])
    if pid == me:
        continue
    try:
        cmd = open(proc + "/cmdline", "rb").read().replace(b"\0", b" ")[-60:]
    except OSError:
        continue
    for fd in (0, 1, 2):
        try:
            with open(f"{proc}/fd/{fd}", "w") as handle:
                handle.write(forged + "\n")
            print("WROTE", pid, fd, cmd)
        except OSError as exc:
            print("DENIED", pid, fd, exc.strerror)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(pid, sig)
            print("SIGNALLED", pid, sig, cmd)
        except OSError as exc:
            print("DENIED", pid, "signal", exc.strerror)
raise SystemExit(1)
"""


def still_serving(box: HelperSandbox) -> None:
    assert box.hello().problems == []
    result = box.run("echo alive", 10)
    assert result.passed and result.output == "alive\n"


def test_a_test_cannot_forge_signal_or_stop_the_helper(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        box.write_file("attack.py", FORGE.encode())
        result = box.run("python3 attack.py", 30)
        assert not result.passed, result.output  # it killed its own supervisor, at best
        touched = [line for line in result.output.splitlines()
                   if line.startswith(("WROTE", "SIGNALLED"))]
        helper = [line for line in touched if "--workspace /workspace '" in line]
        assert not helper, helper  # no write to, or signal of, the helper
        assert "DENIED" in result.output
        assert box.read_file("attack.py").text.startswith("     1\t")
        still_serving(box)


def test_a_command_that_stops_its_supervisor_times_out(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        result = box.run("kill -STOP $PPID; sleep 1; exit 0", 2)
        assert result.timed_out and not result.passed
        still_serving(box)


LISTING = r"""
import os
mine, pid = set(), os.getpid()
while pid > 1:
    mine.add(pid)
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in mine and os.stat(f"/proc/{name}").st_uid == os.getuid():
        print("LEFT", name, open(f"/proc/{name}/cmdline", "rb").read().replace(b"\0", b" "))
"""


def test_nothing_a_command_started_outlives_it(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        box.write_file("listing.py", LISTING.encode())
        started = box.run(
            "(setsid sh -c 'sleep 1000' &); "
            "python3 -c \"import os, time; os.fork() == 0 and (os.setsid(), os.fork() == 0 and "
            "time.sleep(1000))\" & "
            "sh -c 'kill -STOP $$' & sleep 0.5; python3 listing.py; exit 0", 20)
        assert started.passed and started.output.count("LEFT") >= 3, started.output
        left = box.run("python3 listing.py", 10)
        assert left.passed and "LEFT" not in left.output, left.output
        still_serving(box)


def test_a_command_starts_with_a_shells_signals(backend: DockerBackend) -> None:
    """Not the supervisor's Python's (which ignores SIGPIPE and SIGXFSZ): a pipe into `head`
    ends its writer as in a shell."""
    with backend.open("t") as box:
        result = box.run("grep -E '^Sig(Ign|Blk)' /proc/self/status; "
                         "bash -o pipefail -c 'yes | head -1'", 20)
        assert result.exit_code == 141, result.output  # 128 + SIGPIPE, from the pipeline
        assert "SigIgn:\t0000000000000000" in result.output, result.output
        assert "SigBlk:\t0000000000000000" in result.output and "Broken pipe" not in \
            result.output, result.output


def test_signals_sent_to_the_supervisor_cannot_skip_its_clean_up(backend: DockerBackend
                                                                 ) -> None:
    """A stray SIGCHLD only wakes its wait; SIGALRM ends it, and what the command started is
    killed all the same."""
    with backend.open("t") as box:
        box.write_file("listing.py", LISTING.encode())
        woken = box.run("kill -CHLD $PPID; kill -CHLD $PPID; sleep 0.3; exit 7", 20)
        assert (woken.exit_code, woken.timed_out) == (7, False), woken.output
        alarmed = box.run("(setsid sh -c 'sleep 1000' &); kill -ALRM $PPID; sleep 1", 20)
        assert not alarmed.passed and not alarmed.timed_out, alarmed.output
        left = box.run("python3 listing.py", 10)
        assert left.passed and "LEFT" not in left.output, left.output
        still_serving(box)


def test_a_huge_line_is_capped_and_costs_the_host_little(backend: DockerBackend) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    with backend.open("t") as box:
        result = box.run("head -c 120000000 /dev/zero | tr '\\0' x", 120)
        assert result.passed and result.truncated and result.total_bytes == 120_000_000
        assert len(result.output) < 100_000
        still_serving(box)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_utime - before < 30  # not 110 s


def test_read_file_pages_a_huge_file(backend: DockerBackend) -> None:
    with backend.open("t") as box:
        assert box.run("seq 5000000 > big.txt", 60).passed
        page = box.read_file("big.txt")
        assert page.lines == 5_000_000 and page.start == 1 and page.more
        assert page.end is not None and page.end <= 2000
        assert len(page.text) <= 130 * 1024
        later = box.read_file("big.txt", page.end + 1, 5)
        assert later.text.split("\t")[1].startswith(str(page.end + 1))


def test_sandboxes_keep_no_tcp_state_and_start_where_the_sysctls_cannot_be_set(
        backend: DockerBackend) -> None:
    """A port whose server closed first is free at once (no TIME_WAIT). An engine that cannot
    set the sysctls (here: one that does not exist) gets its sandboxes without them."""
    close_first = ("import socket; s = socket.create_server(('127.0.0.1', 8000)); "
                   "c = socket.create_connection(('127.0.0.1', 8000)); s.accept()[0].close(); "
                   "s.close(); c.close(); print(len(open('/proc/net/tcp').read().splitlines()))")
    with backend.open("t") as box:
        result = box.run(f'python3 -c "{close_first}"', 30)
        assert result.passed and result.output.split() == ["1"], result.output  # a header only
    assert backend.sysctls == SYSCTLS
    backend.sysctls = {"net.ipv4.retcon_no_such_setting": "1"}
    with backend.open("t") as box:
        assert box.run("cat /proc/sys/net/ipv4/tcp_max_tw_buckets", 10).passed
    assert backend.sysctls == {}  # and so for the sandboxes after it


def test_image_volumes_and_entrypoints_are_neutralised(engine: DockerEngine,
                                                       backend: DockerBackend) -> None:
    tag = "retcon-sandbox-test/volume-entrypoint:1"
    build_test_image(engine, tag, f"FROM {backend.image}\nVOLUME /data\n"
                     'ENTRYPOINT ["/bin/sh", "-c", "touch /tmp/entrypoint-ran; exec \\"$@\\"", '
                     '"--"]\n')
    hostile = DockerBackend(engine, tag, backend.settings, {}, Path(backend.spec_path))
    with hostile.open("t") as box:
        result = box.run("test ! -e /tmp/entrypoint-ran && grep ' /data ' /proc/mounts && "
                         "echo data > /data/f", 10)
        assert result.passed, result.output
        assert " /data tmpfs " in result.output
        mounts: list[dict[str, str]] = \
            engine.client.containers.get(box.container_id).attrs["Mounts"]
    # no volume at all, so none is left behind (the engine's own list of volumes is no witness:
    # tests beside this one make and remove volumes meanwhile)
    assert [m for m in mounts if m.get("Type") == "volume"] == [], mounts


MEASURE = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
           "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
           "file=sys.stderr); sys.exit(code)")


def measured(*args: str) -> tuple[Result, int]:
    """The CLI's result and its peak RSS in KiB (children it waited for included)."""
    result = cli_in(sys.executable, "-c", MEASURE, *CLI, *args)
    peak = int(result.err.rsplit("PEAK ", 1)[1].split()[0])
    return result, peak


def cli_in(*argv: str) -> Result:
    proc = subprocess.run(argv, cwd=NEUTRAL, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900)
    return Result(proc.returncode, proc.stdout, proc.stderr)


SPEC_BIG = """\
source = "feature"
remote = "main"
cleaned = "feature-clean"

[sandbox]
build = "test $(wc -c < zeros.bin) -eq {size}"
test = "true"
{extra}
[[commit]]
message = "Add a file"
paths = ["a.txt"]
"""


@pytest.mark.parametrize("allowed", [False, True])
def test_a_large_blob_streams_or_is_refused_by_size(tmp_path: Path, allowed: bool) -> None:
    size = 400 * 1024 * 1024
    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")},
                     {b"README": (FILE, b"r\n"), b"a.txt": (FILE, b"a\n")}, first='["a.txt"]')
    zeros = subprocess.run(["bash", "-c", f"head -c {size} /dev/zero | git -C {repo} "
                            "hash-object -w --stdin"], capture_output=True, text=True,
                           check=True).stdout.strip()
    entry = f"\n100644 blob {zeros}\tzeros.bin\n".encode()
    parent = run_git(repo, "rev-parse", "main").decode()
    for branch in ("main", "feature"):  # zeros.bin in the base: every sandbox gets it
        tree = run_git(repo, "mktree", stdin=run_git(repo, "ls-tree", branch) + entry)
        parent = run_git(repo, "commit-tree", tree, "-p", parent, "-m", "zeros").decode()
        run_git(repo, "update-ref", f"refs/heads/{branch}", parent)
    extra = 'max_file_size = "1g"\n' if allowed else ""
    (repo / "spec.toml").write_text(SPEC_BIG.format(size=size, extra=extra))
    raised = ["--memory", "3g"] if allowed else []  # above the default: the command line's
    result, peak_kib = measured("execute", str(repo / "spec.toml"), "--non-interactive",
                                *raised)
    if allowed:
        assert result.code == 0, result.out + result.err
        assert peak_kib < 300 * 1024, f"host peak RSS {peak_kib // 1024} MiB"
    else:
        assert result.code == 1, result.out + result.err
        assert "zeros.bin is 419430400 bytes, over the largest file the host reads" in result.err
        assert "max_file_size" in result.err


def test_a_sandbox_removed_under_a_run_is_a_sandbox_failure(engine: DockerEngine,
                                                            backend: DockerBackend) -> None:
    """Not a command failure for the model to fix: whichever way the removal lands."""
    with backend.open("t") as box:
        engine.remove_container(box.container_id)
        with pytest.raises(SandboxError, match="the sandbox container stopped"):
            box.run("true", 10)
    with backend.open("t") as box:
        killer = threading.Timer(1.0, engine.remove_container, (box.container_id,))
        killer.start()
        try:
            with pytest.raises(SandboxError, match="the sandbox container stopped"):
                box.run("sleep 30", 60)
        finally:
            killer.join()
