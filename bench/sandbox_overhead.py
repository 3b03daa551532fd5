"""What the sandbox costs, side by side with the alternative, in one run.

    python3 bench/sandbox_overhead.py [--calls 300] [--files 5000] [--repeat 5]

Prints: time to a ready container; tool-call latency p50/p95 through the persistent helper
against one `docker exec` per call; copy-in and copy-out of a FILES-file repository (our tar
stream in through the helper; out, one streamed batch of frames made into git objects and a
tree, and, as before 0.3, reading each file back as text; against `docker cp`-style archives of
a plain container: copy-out is the median of REPEAT runs, alternated with `docker cp`'s, each
into a fresh repository; `docker cp` cannot read the sandbox itself, whose workspace is a
tmpfs; with the CPU time each took, when the engine runs on this machine: helper, host
and git processes against dockerd, which makes `docker cp`'s archive (dockerd serves every
client of the engine: on a shared one its figure is an upper bound)); the demo's build and
tests in the sandbox against the same on the host;
the whole per-commit overhead; and the CPU one command's exec costs: the supervisor alone
against the whole helper started for each command, as before. Nothing is asserted: these are
figures to read.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from verify import cpu_ticks  # bench/verify.py, beside this script

from retcon_sandbox.archive import of_bytes
from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.docker.sandboxes import COMMAND_UID, GID, python_argv, supervisor_argv
from retcon_sandbox.backends.workspace import sandbox_tree
from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.resources import helper_source
from retcon_sandbox.spec.settings import DEFAULTS

BUILD = "python3 -m compileall -q shop tests"
TEST = "python3 -m pytest -q -p no:cacheprovider"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def repo_tar(files: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(files):
            data = f"# module {i}\nVALUE = {i}\n".encode() * 20
            info = tarfile.TarInfo(f"pkg{i % 50}/mod{i}.py")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def demo_tar() -> bytes:
    files = dict(demo_project.BASE)
    for _, changes in demo_project.MESSY:
        files.update({k: v for k, v in changes.items() if v is not None})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def proc_cpu(pid: int | None) -> float:
    """CPU seconds of a process of this machine and of the children it waited for."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU seconds of this process and of the git processes it waited for."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def helper_pid(engine: DockerEngine, container_id: str) -> int | None:
    """The helper's process id on this machine (None if the engine runs elsewhere)."""
    top = engine.client.api.top(container_id, ps_args="-eo pid,args")
    pid = next((int(p[0]) for p in top["Processes"] if "--workspace" in p[1]), None)
    return pid if pid and os.path.exists(f"/proc/{pid}") else None


def _dockerd() -> int | None:
    found = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    return int(found[0]) if found else None


DOCKERD = _dockerd()


def row(what: str, ours: str, other: str) -> None:
    print(f"  {what:<44} {ours:>16}   {other:>16}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5, help="copy-out runs (median shown)")
    args = parser.parse_args()
    engine = DockerEngine()
    sandboximages.ensure(engine, sandboximages.default_image(),
                         lambda line: print(line, file=sys.stderr))
    backend = DockerBackend(engine, sandboximages.default_image(), DEFAULTS, {},
                            Path("/tmp/bench-spec.toml"))

    ready = []
    for _ in range(5):
        start = time.perf_counter()
        with backend.open("bench"):
            ready.append(time.perf_counter() - start)
    print(f"\nretcon-sandbox sandbox overhead ({engine.client.version()['Version']} engine)\n")
    row("", "retcon-sandbox", "alternative")
    row("ready container (create, start, helper)", ms(statistics.median(ready)), "")

    big = repo_tar(args.files)
    plain = engine.client.containers.run(sandboximages.default_image(), ["sleep", "infinity"],
                                         detach=True, network_mode="none",
                                         labels={"retcon-sandbox.run": "bench"})
    try:
        cp_in = timed(lambda: plain.put_archive("/tmp", big))
        with backend.open("bench") as box, tempfile.TemporaryDirectory() as scratch:
            copy_in = timed(lambda: box.load_tree(of_bytes(big, args.files)))
            box.write_file("probe.txt", b"hello\n" * 20)
            calls = [timed(lambda: box.read_file("probe.txt")) for _ in range(args.calls)]
            names = box.list_files()
            text_reads = timed(lambda: [box.read_file(n) for n in names])
            copy_out, cp_out = [], []
            helper = helper_pid(engine, box.container_id)
            ours_cpu, cp_cpu = 0.0, 0.0
            for i in range(args.repeat):  # alternated, so both see the same load
                repo = Repo.init(Path(scratch) / f"repo{i}")  # every object new each time
                before = own_cpu() + proc_cpu(helper)
                copy_out.append(timed(partial(sandbox_tree, box, repo, DEFAULTS.max_file_size)))
                ours_cpu += own_cpu() + proc_cpu(helper) - before
                before = proc_cpu(DOCKERD)
                cp_out.append(timed(lambda: b"".join(plain.get_archive("/tmp")[0])))
                cp_cpu += proc_cpu(DOCKERD) - before
            container = engine.client.containers.get(box.container_id)  # ours: shared engine
            execs = [timed(lambda: container.exec_run(["cat", "/workspace/probe.txt"],
                                                      user="10001:10001"))
                     for _ in range(max(20, args.calls // 10))]
    finally:
        plain.remove(force=True)
    row("tool call p50 (helper vs docker exec)", ms(pct(calls, 0.5)), ms(pct(execs, 0.5)))
    row("tool call p95 (helper vs docker exec)", ms(pct(calls, 0.95)), ms(pct(execs, 0.95)))
    row(f"copy-in, {args.files} files (helper vs docker cp)", ms(copy_in), ms(cp_in))
    out, cp = statistics.median(copy_out), statistics.median(cp_out)
    row(f"copy-out, {args.files} files (one batch vs docker cp)", ms(out), ms(cp))
    row(f"copy-out, {args.files} files (batch vs text reads)", ms(out), ms(text_reads))
    row("  copy-out runs, fastest (batch vs docker cp)", ms(min(copy_out)), ms(min(cp_out)))
    if helper and DOCKERD:  # CPU time, which the machine's load does not inflate
        row("  copy-out CPU (helper+host+git vs dockerd)", ms(ours_cpu / args.repeat),
            ms(cp_cpu / args.repeat))

    with tempfile.TemporaryDirectory() as host_dir:
        with tarfile.open(fileobj=io.BytesIO(demo_tar())) as tar:
            tar.extractall(host_dir, filter="data")
        host = [timed(partial(subprocess.run, c, shell=True, cwd=host_dir, check=True,
                              capture_output=True)) for c in (BUILD, TEST)]
    start = time.perf_counter()
    with backend.open("bench") as box:
        box.load_tree(of_bytes(demo_tar(), 0))
        inside = [box.run(c, 120).seconds for c in (BUILD, TEST)]
    total = time.perf_counter() - start
    row("demo build (sandbox vs host)", ms(inside[0]), ms(host[0]))
    row("demo tests (sandbox vs host)", ms(inside[1]), ms(host[1]))
    overhead = total - sum(inside)  # container, helper, copy-in, round trips, removal
    row("sandbox overhead per commit (all but the commands)", ms(overhead), "")
    exec_cpu(engine, backend, max(20, args.calls // 10))
    print()


def busy_cpu() -> float:
    """Every process's CPU time so far, in seconds (the engine's and the containers' count
    too): the machine's jiffies that were not idle (`verify.cpu_ticks`)."""
    idle, total = cpu_ticks()
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def exec_cpu(engine: DockerEngine, backend: DockerBackend, n: int) -> None:
    """The CPU one build or test command's exec costs beyond the command (`true`): the
    supervisor alone against the whole helper started for each command (as before 0.3: the
    same supervising code, behind the helper's protocol and imports), and a bare exec."""
    whole = helper_source().split('\nif __name__ == "__main__":\n', 1)[0]
    whole += "\nsupervised(sys.argv[1:])\n"
    variants = {"supervisor": supervisor_argv("--run", "60", "true"),
                "whole helper": python_argv("retcon-helper", whole, "--run", "60", "true"),
                "bare exec": ["true"]}
    spent = dict.fromkeys(variants, 0.0)
    with backend.open("bench") as box:
        for _ in range(n):  # alternated, so each sees the same load
            for name, argv in variants.items():
                before = busy_cpu()
                code, _ = engine.exec_run(box.container_id,
                                          ["env", "RETCON_SANDBOX_SUPERVISE=1", *argv],
                                          f"{COMMAND_UID}:{GID}")
                spent[name] += busy_cpu() - before
                if code != 0:
                    sys.exit(f"{name}: exit {code}")
    row("CPU per command exec (supervisor vs helper)", ms(spent["supervisor"] / n),
        ms(spent["whole helper"] / n))
    row("  of which the exec itself (docker exec true)", ms(spent["bare exec"] / n), "")


if __name__ == "__main__":
    main()
