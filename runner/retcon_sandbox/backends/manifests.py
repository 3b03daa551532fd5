"""What of a manifest keys a prepared environment: the parts that change what `pip install`,
`uv`, `poetry` or `cargo fetch` do, and nothing else (a lint rule, the package's own version).

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

# What a Python installer reads of pyproject.toml: the build backend, the dependencies (and
# where they are declared), the entry points an editable install writes. Not the version, nor
# any tool's lint or formatting settings.
PYPROJECT: tuple[tuple[str, ...], ...] = (
    ("build-system",),
    ("project", "name"), ("project", "requires-python"), ("project", "dependencies"),
    ("project", "optional-dependencies"), ("project", "dynamic"), ("project", "scripts"),
    ("project", "gui-scripts"), ("project", "entry-points"),
    ("dependency-groups",),
    ("tool", "poetry", "dependencies"), ("tool", "poetry", "dev-dependencies"),
    ("tool", "poetry", "group"), ("tool", "poetry", "extras"), ("tool", "poetry", "source"),
    ("tool", "poetry", "scripts"),
    ("tool", "uv"),
    ("tool", "pdm", "dev-dependencies"), ("tool", "pdm", "resolution"), ("tool", "pdm", "source"),
    ("tool", "setuptools", "dynamic"),
    ("tool", "hatch", "metadata"), ("tool", "hatch", "envs"),
)
# What cargo reads of Cargo.toml to resolve and fetch: not [package] version, nor lints.
CARGO: tuple[tuple[str, ...], ...] = (
    ("dependencies",), ("dev-dependencies",), ("build-dependencies",), ("target",),
    ("features",), ("patch",), ("replace",),
    ("workspace", "members"), ("workspace", "exclude"), ("workspace", "default-members"),
    ("workspace", "dependencies"), ("workspace", "resolver"), ("package", "resolver"),
)
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
    data = read(blob)
    document = parse(data) if data is not None and len(data) <= MANIFEST_LIMIT else None
    if document is None:
        return whole(mode, blob)
    if name in LOCKS:
        return {WHOLE: "lock " + digest(without_own_versions(document))}
    return tables(document, TABLES[name])


def parse(data: bytes) -> dict[str, Any] | None:
    """A TOML document, or None if it is not one (never an exception: the file is untrusted)."""
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


def tables(document: dict[str, Any], wanted: tuple[tuple[str, ...], ...]) -> Parts:
    found: Parts = {}
    for keys in wanted:
        value: Any = document
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            found[part_name(keys)] = digest(value)
    return found


def part_name(keys: tuple[str, ...]) -> str:
    """`[project] dependencies`, `[build-system]`, `[tool.poetry] group`."""
    if len(keys) == 1:
        return f"[{keys[0]}]"
    return f"[{'.'.join(keys[:-1])}] {keys[-1]}"


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
