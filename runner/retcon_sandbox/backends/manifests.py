"""What of a manifest keys a prepared environment: all of it but what never changes what
`pip install`, `uv`, `poetry` or `cargo fetch` do (a lint rule, the package's own version).

A manifest is parsed on the host, in memory, from the blob's bytes (never checked out): a file
that is not valid TOML, is too large, or is not a regular file is keyed on its whole content.
Each input file is a `Parts` mapping: the name of a part ("" for the whole file,
"[project] dependencies" for a table) to a digest. Pure: no git, no Docker.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Callable
from typing import Any

Parts = dict[str, str]  # part name ("" = the whole file) -> digest
Fingerprint = dict[str, Parts]  # input path -> its parts
ReadBlob = Callable[[str], bytes | None]  # a blob's bytes by id, None when too large

MANIFEST_LIMIT = 4 * 1024 * 1024  # larger manifests are keyed on their whole content
WHOLE = ""

# What never changes what an installer (pip, uv, poetry, cargo fetch) does: the package's own
# version and descriptive metadata, and the settings of tools that lint, format, test or
# release (not tox's: its table lists environments and what they install). Everything else of
# the file keys the environment, so a table nobody listed here (a build hook,
# `[tool.setuptools] cmdclass`, Cargo's `build`, `links`, `[profile]`) does.
PYPROJECT: frozenset[tuple[str, ...]] = frozenset({
    ("project", "version"), ("project", "description"), ("project", "keywords"),
    ("project", "classifiers"), ("project", "urls"), ("project", "authors"),
    ("project", "maintainers"),
    *(("tool", name) for name in (
        "ruff", "black", "isort", "mypy", "pyright", "pylint", "flake8", "pytest", "coverage",
        "codespell", "bandit", "pydocstyle", "docformatter", "towncrier", "bumpversion",
        "commitizen", "semantic_release", "tbump", "interrogate", "vulture", "yapf",
        "autopep8", "pycln", "pyupgrade", "cibuildwheel", "pytype", "deptry")),
})
CARGO: frozenset[tuple[str, ...]] = frozenset({
    ("package", "version"), ("package", "description"), ("package", "keywords"),
    ("package", "categories"), ("package", "authors"), ("package", "homepage"),
    ("package", "documentation"), ("package", "repository"),
    ("workspace", "package", "version"), ("lints",), ("workspace", "lints"), ("badges",),
    # the oldest toolchain the crate supports: checked by a build, never fetched or installed
    ("package", "rust-version"), ("workspace", "package", "rust-version"),
})
SPLIT = ("project", "tool", "package", "workspace")  # tables whose keys are parts of their own
MAX_DOTS = 256  # a line with more: the file is keyed whole (tomllib is slow on such keys)
TABLES = {"pyproject.toml": PYPROJECT, "Cargo.toml": CARGO}
LOCKS = ("Cargo.lock", "uv.lock")  # keyed without the version of the project's own packages
REGULAR = ("100644", "100755")


def digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def whole(mode: str, blob: str) -> Parts:
    return {WHOLE: f"{mode} {blob}"}


def parts(path: str, mode: str, blob: str, read: ReadBlob | None) -> Parts:
    """The parts of the input file `path` that key the environment."""
    name = path.rsplit("/", 1)[-1]
    if read is None or mode not in REGULAR or (name not in TABLES and name not in LOCKS):
        return whole(mode, blob)
    cached = _PARTS.get((name, mode, blob))
    if cached is None:
        cached = _parts(name, mode, blob, read(blob))
        if len(_PARTS) >= PARTS_CACHE:
            _PARTS.clear()
        _PARTS[(name, mode, blob)] = cached
    return dict(cached)


PARTS_CACHE = 4096
_PARTS: dict[tuple[str, str, str], Parts] = {}  # a blob's parts: the same for the same bytes


def _parts(name: str, mode: str, blob: str, data: bytes | None) -> Parts:
    document = parse(data) if data is not None and len(data) <= MANIFEST_LIMIT else None
    if document is None:
        return whole(mode, blob)
    try:
        if name in LOCKS:
            return {WHOLE: "lock " + digest(without_own_versions(document))}
        return tables(document, TABLES[name])
    except (RecursionError, ValueError):  # nested too deep to digest: the whole file, then
        return whole(mode, blob)


def parse(data: bytes) -> dict[str, Any] | None:
    """A TOML document, or None if it is not one, or is one that would take long to parse
    (never an exception: the file is untrusted)."""
    if any(line.count(b".") > MAX_DOTS for line in data.splitlines()):
        return None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None


def dynamic_files(data: bytes) -> list[str]:
    """The files setuptools reads its dynamic metadata from (`[tool.setuptools.dynamic]
    dependencies = {file = ["requirements.txt"]}`), as written."""
    document = parse(data)
    dynamic: Any = document
    for key in ("tool", "setuptools", "dynamic"):
        dynamic = dynamic.get(key) if isinstance(dynamic, dict) else None
    if not isinstance(dynamic, dict):
        return []
    names: list[str] = []
    for value in dynamic.values():
        if isinstance(value, dict):
            files = value.get("file")
            files = [files] if isinstance(files, str) else files
            if isinstance(files, list):
                names += [f for f in files if isinstance(f, str)]
    return names


def tables(document: dict[str, Any], quiet: frozenset[tuple[str, ...]]) -> Parts:
    """The document without its `quiet` keys, as parts: one per top-level table, the tables
    of SPLIT one per key (`[project] dependencies`, `[tool.uv]`)."""
    found: Parts = {}
    for key, value in document.items():
        if key in SPLIT and isinstance(value, dict):
            for sub, inner in value.items():
                kept = _without(inner, quiet, (key, sub))
                if kept is not _QUIET:
                    found[part_name(key, sub)] = digest(kept)
        else:
            kept = _without(value, quiet, (key,))
            if kept is not _QUIET:
                found[part_name(key)] = digest(kept)
    return found


_QUIET = object()  # a value left out whole


def _without(value: Any, quiet: frozenset[tuple[str, ...]], at: tuple[str, ...]) -> Any:
    """`value` (found at the key path `at`) without the quiet keys below it."""
    if at in quiet:
        return _QUIET
    if not isinstance(value, dict) or not any(q[:len(at)] == at for q in quiet):
        return value
    kept = {k: _without(v, quiet, (*at, k)) for k, v in value.items()}
    return {k: v for k, v in kept.items() if v is not _QUIET}


def part_name(key: str, sub: str | None = None) -> str:
    """`[dependencies]`, `[project] dependencies`, `[tool.uv]`."""
    if sub is None:
        return f"[{key}]"
    return f"[{key}.{sub}]" if key == "tool" else f"[{key}] {sub}"


def without_own_versions(document: dict[str, Any]) -> dict[str, Any]:
    """A lock file without the versions of the project's own packages (those with no registry
    or git source): bumping the project's version rewrites its entry, and fetches nothing."""
    packages = document.get("package")
    if not isinstance(packages, list):
        return document
    kept = []
    for package in packages:
        if isinstance(package, dict) and _own(package.get("source")):
            package = {k: v for k, v in package.items() if k != "version"}
        kept.append(package)
    return {**document, "package": kept}


def _own(source: object) -> bool:
    """Cargo: a path or workspace package has no `source`; uv: `editable`, `virtual` or
    `directory` sources are the project's own."""
    if source is None:
        return True
    return isinstance(source, dict) and bool({"editable", "virtual", "directory"} & set(source))


def changes(old: Fingerprint | None, new: Fingerprint) -> list[str]:
    """What differs between two fingerprints, as a person reads it: "Cargo.toml
    [dependencies] changed", "requirements.txt changed", "uv.lock added"."""
    if old is None:
        return []
    said = []
    for path in sorted(set(old) | set(new)):
        before, after = old.get(path), new.get(path)
        if before == after:
            continue
        if before is None:
            said.append(f"{path} added")
        elif after is None:
            said.append(f"{path} removed")
        elif WHOLE in before or WHOLE in after:
            said.append(f"{path} changed")
        else:
            for part in sorted(set(before) | set(after)):
                if before.get(part) != after.get(part):
                    verb = ("added" if part not in before else
                            "removed" if part not in after else "changed")
                    said.append(f"{path} {part} {verb}")
    return said
