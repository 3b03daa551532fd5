"""A pytest plugin for bench/suite.py: the CPU time of each test and of each fixture's setup.

Loaded by bench/suite.py (`-p suite_plugin`, with bench/ on PYTHONPATH); it does nothing
unless RETCON_BENCH_OUT names a folder. Each test process (each xdist worker, or the one
process without `-n`) moves itself into a cgroup of its own under RETCON_BENCH_CGROUP, when
that is set: a cgroup counts the CPU of every process it holds, the forked command lines and
their git and the fork server included, whether or not anyone waits for them. Without a
cgroup the figures are the process's own CPU and that of the children it waited for.

Written per test process to RETCON_BENCH_OUT/<worker>.jsonl, one object a line:
{"kind": "test", "id": ..., "cpu": s, "wall": s} and {"kind": "fixture", "id": name,
"scope": ..., "cpu": s, "wall": s} (a fixture's own setup: the fixtures it depends on are set
up before it, and counted as themselves).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest

_STATE: dict[str, Any] = {}


def _cpu() -> float:
    usage = _STATE.get("usage")
    if usage is not None:
        text = usage.read_text()
        if usage.name == "cpu.stat":  # cgroup v2: usage_usec
            fields = dict(line.split() for line in text.splitlines())
            return int(fields["usage_usec"]) / 1e6
        return int(text) / 1e9
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("RETCON_BENCH_OUT")
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    group = os.environ.get("RETCON_BENCH_CGROUP")
    if group:
        own = Path(group) / worker
        try:
            own.mkdir(exist_ok=True)
            (own / "cgroup.procs").write_text(str(os.getpid()))
            usage = own / "cpuacct.usage"
            _STATE["usage"] = usage if usage.exists() else own / "cpu.stat"
        except OSError:
            pass
    handle: IO[str] = open(Path(out) / f"{worker}.jsonl", "a", buffering=1,  # noqa: SIM115
                           encoding="utf-8")  # a line at a time: a run cut short still tells
    _STATE["out"] = handle


def pytest_unconfigure(config: pytest.Config) -> None:
    handle = _STATE.pop("out", None)
    if handle is not None:
        handle.close()


def _write(record: dict[str, Any]) -> None:
    handle = _STATE.get("out")
    if handle is not None:
        handle.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    cpu, wall = _cpu(), time.monotonic()
    yield
    _write({"kind": "test", "id": item.nodeid, "cpu": _cpu() - cpu,
            "wall": time.monotonic() - wall})


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any],
                         request: pytest.FixtureRequest) -> Generator[None]:
    cpu, wall = _cpu(), time.monotonic()
    yield
    _write({"kind": "fixture", "id": fixturedef.argname, "scope": fixturedef.scope,
            "cpu": _cpu() - cpu, "wall": time.monotonic() - wall})
