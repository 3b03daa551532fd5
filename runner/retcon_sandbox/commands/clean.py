"""`retcon-sandbox clean`: remove the sandbox containers of runs that are no longer alive (killed
with -9, or on a host that rebooted). A run in progress keeps its containers, and so does a run
on another host sharing the engine; `--all` removes those too. So it does with the images of
setups that were killed after saving their image and before naming it (unnamed images that carry
a prepared environment's label, and the labels of their run). Without spec names, it also
removes the package caches that no prepared environment uses."""

from __future__ import annotations

import argparse
import os

from retcon_sandbox.backends.docker import liveness, sandboximages
from retcon_sandbox.backends.docker.engine import LABEL_SPEC, DockerEngine
from retcon_sandbox.errors import EXIT_OK, ImageError
from retcon_sandbox.report import JsonReporter


def removable(labels: dict[str, str], here: str, everything: bool) -> bool:
    if everything:
        return True
    owner = liveness.owner_of(labels)
    started = liveness.process_start(owner.pid) if owner and owner.host == here else None
    return not liveness.alive(owner, here, started)


def named(labels: dict[str, str], specs: set[str]) -> bool:
    """Whether a container, network or image belongs to the specs given (any, when none is)."""
    return not specs or labels.get(LABEL_SPEC) in specs


def run(args: argparse.Namespace) -> int:
    engine = DockerEngine()
    specs = {os.path.realpath(spec) for spec in args.specs}
    here = liveness.host()
    removed = kept = networks = 0
    for container_id, labels in engine.sandbox_containers().items():
        if not named(labels, specs):
            continue
        if removable(labels, here, args.all):
            engine.remove_container(container_id)
            removed += 1
        else:
            kept += 1
    for network_id, labels in engine.sandbox_networks().items():
        if named(labels, specs) and removable(labels, here, args.all):
            engine.remove_network(network_id)
            networks += 1
    unnamed = _unnamed_environments(engine, specs, here, args.all)
    # Package caches no prepared environment uses (one a setup still uses is kept)
    caches = [] if specs else sandboximages.prune_caches(engine, lambda _: None)
    if getattr(args, "json", False):
        JsonReporter().emit("clean", removed=removed, kept=kept, networks=networks,
                            images=unnamed, caches=len(caches), all=bool(args.all))
        return EXIT_OK
    print(f"Removed {removed} sandbox container(s)." if removed else
          "No sandbox containers of finished runs left.")
    if unnamed:
        print(f"Removed {unnamed} unnamed environment image(s) of setups that were killed.")
    if caches:
        print(f"Removed {len(caches)} package cache(s) no prepared environment uses.")
    if kept:
        print(f"Kept {kept} of runs still in progress (or on other hosts); `retcon-sandbox clean "
              "--all` removes them too.")
    return EXIT_OK


def _unnamed_environments(engine: DockerEngine, specs: set[str], here: str,
                          everything: bool) -> int:
    """Remove the unnamed images a killed setup left (see the module's text); the count."""
    removed = 0
    for image_id, labels in engine.untagged_images(sandboximages.LABEL_ENV_SCOPE).items():
        if named(labels, specs) and removable(labels, here, everything):
            try:
                engine.remove_image(image_id)
            except ImageError:  # a container still uses it: once that is gone, next time
                continue
            removed += 1
    return removed
