"""Which files of a tree a source file imports, by the usual rules of Python, Rust and
JavaScript/TypeScript modules: for `plan`'s ordering, and for the files a setup script runs in
turn (backends/envkeys.py)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

_PY_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)(\w[\w.]*)?[ \t]+import[ \t]+(\([^)]*\)|[\w \t,]*)",
                      re.MULTILINE)
_PY_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.MULTILINE)
_RS_MOD = re.compile(r"^[ \t]*(?:pub(?:\([\w\s]*\))?\s+)?mod\s+(\w+)\s*;", re.MULTILINE)
_RS_USE = re.compile(r"\buse\s+(\w+)((?:::\w+)*)")
_JS = re.compile(r"""(?:\bfrom\s+|\brequire\s*\(\s*|\bimport\s*\(?\s*)['"](\.{1,2}/[^'"]*)['"]""")
_RS_ROOTS = ("lib.rs", "main.rs", "mod.rs")


def imports(path: str, text: str, files: Iterable[str] | frozenset[str],
            script: bool = False) -> set[str]:
    """The files of `files` that `path` (with content `text`) imports, by the usual rules of
    Python, Rust and JavaScript/TypeScript modules. Unknown languages import nothing.
    `script`: `path` is run as a script (`python tools/prep.py`), so its own folder is where
    Python looks first for what it imports."""
    tree = files if isinstance(files, frozenset) else frozenset(files)
    if path.endswith(".py"):
        found = _python(path, text, tree, script)
    elif path.endswith(".rs"):
        found = _rust(path, text, tree)
    elif path.endswith((".js", ".jsx", ".ts", ".tsx", ".mjs", ".cjs")):
        found = _javascript(path, text, tree)
    else:
        return set()
    found.discard(path)
    return found


def _python_module(dotted: str, tree: frozenset[str], roots: tuple[str, ...]) -> set[str]:
    parts = [p for p in dotted.split(".") if p]
    found: set[str] = set()
    for root in roots:
        for n in range(len(parts), 0, -1):
            base = posixpath.join(root, *parts[:n]) if root else "/".join(parts[:n])
            for candidate in (base + ".py", base + "/__init__.py"):
                if candidate in tree:
                    found.add(candidate)
            if found:
                return found
    return found


def _python(path: str, text: str, tree: frozenset[str], script: bool = False) -> set[str]:
    here = posixpath.dirname(path)
    roots = (*((here,) if script and here else ()), "", "src", "lib", "python")
    found: set[str] = set()
    for dots, module, names in _PY_FROM.findall(text):
        targets = [n.split()[0] for n in names.strip("()").replace("\n", ",").split(",")
                   if n.split() and not n.strip().startswith("#")]
        if dots:
            base = here
            for _ in range(len(dots) - 1):
                base = posixpath.dirname(base)
            prefix = (base.replace("/", ".") + "." if base else "") + module
            rels: tuple[str, ...] = ("",)
        else:
            prefix, rels = module, roots
        for name in targets or [""]:
            found |= _python_module(f"{prefix}.{name}" if name else prefix, tree, rels)
        if not targets:
            found |= _python_module(prefix, tree, rels)
    for group in _PY_IMPORT.findall(text):
        for module in group.split(","):
            found |= _python_module(module.strip(), tree, roots)
    return found


def _rust_crate_root(path: str) -> str:
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("src", "tests", "benches", "examples"):
            return "/".join(parts[:i])
    return ""


def _rust_module(directory: str, name: str, tree: frozenset[str]) -> set[str]:
    base = posixpath.join(directory, name) if directory else name
    return {c for c in (base + ".rs", base + "/mod.rs") if c in tree}


def _rust(path: str, text: str, tree: frozenset[str]) -> set[str]:
    directory, name = posixpath.split(path)
    own = directory if name in _RS_ROOTS else posixpath.join(directory, name[:-3])
    found: set[str] = set()
    for module in _RS_MOD.findall(text):
        found |= _rust_module(own, module, tree)
    src = posixpath.join(_rust_crate_root(path), "src")
    for first, rest in _RS_USE.findall(text):
        segments = [s for s in rest.split("::") if s]
        if first in ("std", "core", "alloc"):
            continue
        if first == "self":
            start = own
        elif first == "super":
            start = posixpath.dirname(own) if name in _RS_ROOTS else directory
        else:  # `crate::a::b`, or `mycrate::a::b` from tests/ or another crate's code
            start = src
        for n in range(len(segments), 0, -1):
            hit = _rust_module(posixpath.join(start, *segments[: n - 1]) if n > 1 else start,
                               segments[n - 1], tree)
            if hit:
                found |= hit
                break
        else:
            if first not in ("crate", "self", "super"):
                found |= {c for c in (posixpath.join(src, "lib.rs"),) if c in tree}
    return found


def _javascript(path: str, text: str, tree: frozenset[str]) -> set[str]:
    here = posixpath.dirname(path)
    found: set[str] = set()
    for spec in _JS.findall(text):
        base = posixpath.normpath(posixpath.join(here, spec))
        for suffix in ("", ".js", ".ts", ".jsx", ".tsx", ".mjs", ".cjs", "/index.js",
                       "/index.ts"):
            if base + suffix in tree:
                found.add(base + suffix)
                break
    return found
