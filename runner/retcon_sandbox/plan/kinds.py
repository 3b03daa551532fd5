"""What kind of file a path is (what it imports: retcon_sandbox/sourceimports.py)."""

from __future__ import annotations

TEST_DIRS = {"test", "tests", "testing", "spec", "specs", "__tests__", "e2e", "it"}
DOC_DIRS = {"doc", "docs", "documentation", "man"}
DOC_EXT = (".md", ".rst", ".adoc", ".txt", ".markdown")
DOC_NAMES = ("readme", "changelog", "changes", "news", "history", "contributing", "authors",
             "license", "copying", "notice", "mkdocs", ".readthedocs")
CONFIG_NAMES = {"pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "cargo.toml",
                "cargo.lock", "package.json", "package-lock.json", "yarn.lock", "go.mod",
                "go.sum", "pnpm-lock.yaml", "poetry.lock", "uv.lock", "tox.ini", "makefile",
                "manifest.in", "rust-toolchain.toml", "tsconfig.json"}


def kind(path: str) -> str:
    """`test`, `docs`, `config` or `code`."""
    parts = path.lower().split("/")
    name = parts[-1]
    stem = name.split(".")[0]
    if any(p in TEST_DIRS for p in parts[:-1]) or stem.startswith("test_") \
            or stem.endswith(("_test", "_spec")) or ".test." in name or ".spec." in name \
            or name == "conftest.py":
        return "test"
    if name in CONFIG_NAMES or (name.startswith(("requirements", "constraints"))
                                and name.endswith(".txt")):
        return "config"
    # a `.txt` inside a folder of code is data the code reads (`app/data/stopwords.txt`)
    text_data = name.endswith(".txt") and len(parts) > 1
    if any(p in DOC_DIRS for p in parts[:-1]) or stem in DOC_NAMES \
            or (name.endswith(DOC_EXT) and not text_data):
        return "docs"
    return "code"


def test_file(path: str) -> bool:
    """A file of tests itself (`test_x.py`, `x_test.go`, `x.spec.ts`), not one that supports
    them (`conftest.py`, fixtures, data under `tests/`)."""
    name = path.lower().rsplit("/", 1)[-1]
    stem = name.split(".")[0]
    return stem.startswith("test_") or stem.endswith(("_test", "_spec")) or ".test." in name \
        or ".spec." in name
