"""The package's folders are its layers: a module imports only from its own layer or the ones
below it, and no two modules import each other, directly or round a cycle (type-only imports
count too, so that import-graph tools see the same picture)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "runner" / "retcon_sandbox"
# Lowest first. Top-level modules not named here are the base layer (errors, text, paths, ...).
LAYERS = ["spec", "repo", "backends", "verify", "summary", "model", "plan", "reconstruct",
          "commands", "cli"]
ADAPTERS = {"docker": "backends.docker.engine", "git": "repo.gitrepo", "gitdb": "repo.gitrepo",
            "openai": "model.llm", "paramiko": "backends.docker.engine",
            "requests": "backends.docker.engine",
            "tenacity": "model.llm"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    first = "cli" if module == "__main__" else module.split(".")[0]
    return LAYERS.index(first) + 1 if first in LAYERS else 0


@functools.cache
def parse(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per test process: each test here walks every module
    of the package, and parsing them all is half a second of CPU."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(path: Path) -> set[str]:
    """Every retcon_sandbox module this file imports, at any depth (function-local too)."""
    found: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "retcon_sandbox":
                found.update(alias.name for alias in node.names if alias.name != "__version__")
            elif node.module.startswith("retcon_sandbox."):
                base = node.module.removeprefix("retcon_sandbox.")
                for alias in node.names:
                    candidate = PACKAGE.joinpath(*base.split("."), alias.name)
                    is_module = candidate.with_suffix(".py").exists() or candidate.is_dir()
                    found.add(f"{base}.{alias.name}" if is_module else base)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("retcon_sandbox.") for a in node.names
                         if a.name.startswith("retcon_sandbox."))
    return found


def third_party(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_no_import_runs_up_the_layers() -> None:
    upward = [f"{module} ({layer(module)}) imports {target} ({layer(target)})"
              for module, targets in graph().items() for target in targets
              if layer(target) > layer(module)]
    assert upward == []


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*trail[trail.index(target):], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_each_library_is_imported_by_its_adapter_alone() -> None:
    imported = {module_name(p): third_party(p) for p in PACKAGE.rglob("*.py")}
    users = {lib: {module for module, libs in imported.items() if lib in libs}
             for lib in ADAPTERS}
    assert all(users[lib] <= {adapter} for lib, adapter in ADAPTERS.items())
    assert all(users[lib] == {ADAPTERS[lib]} for lib in ("docker", "git", "openai"))


def test_only_the_docker_folder_knows_docker() -> None:
    """The rest of `backends` reaches Docker through the `Backend` Protocol alone."""
    docker = [f"{module} imports {target}" for module, targets in graph().items()
              if module.startswith("backends.") and not module.startswith("backends.docker")
              for target in targets if target.startswith("backends.docker")]
    assert docker == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: an import from a higher layer is named."""
    source = tmp_path / "probe.py"
    source.write_text("from retcon_sandbox.reconstruct.driver import run\n")
    assert imports(source) == {"reconstruct.driver"}
    assert layer("reconstruct.driver") > layer("spec.file")
