"""Which sandbox containers `clean` may remove: those of runs that are no longer alive."""

from __future__ import annotations

import os
import subprocess
import sys

from retcon_sandbox.backends.docker.liveness import (
    Owner,
    alive,
    host,
    labels_of,
    owner_of,
    process_start,
    this_process,
)

HERE = "build-host"
RUN = Owner(HERE, 4242, "boot-1:1000")


def test_a_run_is_alive_while_its_process_is_the_same_process() -> None:
    assert alive(RUN, HERE, "boot-1:1000")


def test_a_run_whose_process_is_gone_is_dead() -> None:
    assert not alive(RUN, HERE, None)


def test_a_reused_pid_or_a_reboot_is_not_the_run() -> None:
    assert not alive(RUN, HERE, "boot-1:2000")  # another process got the pid
    assert not alive(RUN, HERE, "boot-2:1000")  # the host rebooted


def test_a_start_that_cannot_be_read_trusts_the_pid() -> None:
    assert alive(Owner(HERE, 4242, ""), HERE, "boot-1:1000")
    assert alive(RUN, HERE, "")


def test_a_run_on_another_host_counts_as_alive() -> None:
    assert alive(RUN, "another-host", None)


def test_a_container_without_owner_labels_counts_as_dead() -> None:
    assert owner_of({"retcon-sandbox.run": "x"}) is None
    assert owner_of({"retcon-sandbox.host": HERE, "retcon-sandbox.pid": "not a pid"}) is None
    assert not alive(None, HERE, "anything")


def test_labels_round_trip() -> None:
    assert owner_of(labels_of(RUN)) == RUN


def test_this_process_is_alive_and_a_finished_one_is_not() -> None:
    me = this_process()
    assert me.host == host() and me.pid == os.getpid() and me.started
    assert alive(me, host(), process_start(os.getpid()))
    assert process_start(os.getpid()) == me.started
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start(child.pid)
    child.wait()
    assert started is None or started != me.started
    assert process_start(child.pid) is None
    assert not alive(Owner(host(), child.pid, started or ""), host(), process_start(child.pid))


def test_a_zombie_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        assert process_start(child.pid) is None
    finally:
        child.wait()
