"""The host's side of each container's keeper (sandbox/keeper.py, every container's first
process): the run holds the container's standard input open, and writes a byte on it every
HEARTBEAT_S seconds. When the run's process is gone (even killed with -9) the kernel closes
those connections, the engine closes the containers' input, and each container ends and is
removed; a run that hangs, or a connection that dies unseen, stops the heartbeat, and each
container ends LEASE_S seconds later. Nothing here decides whether a run is alive: the kernel
and the clock do.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from retcon_sandbox import threads
from retcon_sandbox.backends.docker.engine import DockerEngine

HEARTBEAT_S = 10.0
LEASE_S = 120.0  # twelve heartbeats missed: a busy host is not taken for a hung one
SEND_S = 5.0  # the longest one heartbeat's write may block


class Leases:
    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine
        self._held: dict[str, tuple[Any, socket.socket]] = {}
        self._lock = threading.Lock()
        self._beating: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, container_id: str) -> None:
        """Attach to the (created, not yet started) container's input, and keep it until
        `release`. EngineError when the engine refuses."""
        wrapper = self.engine.attach_stdin(container_id)
        sock: socket.socket = getattr(wrapper, "_sock", wrapper)
        sock.settimeout(SEND_S)
        with self._lock:
            self._held[container_id] = (wrapper, sock)
            if self._beating is None:
                self._beating = threads.start(self._beat, "retcon-leases")

    def release(self, container_id: str) -> None:
        """Close the container's input: it ends, and the engine removes it."""
        with self._lock:
            held = self._held.pop(container_id, None)
        if held is not None:
            _close(held[1])

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                held = list(self._held.items())
            for container_id, (_, sock) in held:
                try:
                    sock.sendall(b"\n")
                except OSError:  # the container is gone, or stopped reading: no lease left
                    self.release(container_id)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
