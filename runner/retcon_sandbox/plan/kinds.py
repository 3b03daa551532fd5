"""What kind of file a path is (what it imports: retcon_sandbox/sourceimports.py)."""

from __future__ import annotations

TEST_DIRS = {"test", "tests", "testing", "spec", "specs", "__tests__", "e2e", "it"}
DOC_DIRS = {"doc", "docs", "documentation", "man"}
DOC_EXT = (".md", ".rst", ".adoc", ".txt", ".markdown")
CODE_EXT = (".py", ".pyi", ".rs", ".js", ".jsx", ".ts", ".tsx", ".mjs", ".cjs", ".go", ".c",
            ".h", ".cc", ".cpp", ".java", ".rb", ".sh")
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
    code = name.endswith(CODE_EXT)  # `lib/history.py` is code, whatever its name
    # a `.txt` inside a folder of code is data the code reads (`app/data/stopwords.txt`)
    text_data = name.endswith(".txt") and len(parts) > 1
    if any(p in DOC_DIRS for p in parts[:-1]) or (stem in DOC_NAMES and not code) \
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


# --- roles: the finer kinds the planner weighs ------------------------------------------------

ROLES = ("deps", "config", "ci", "code", "test", "docs", "changelog")  # the drafting order
CI_DIRS = {".github", ".circleci", ".gitlab", ".buildkite", ".azure-pipelines"}
CI_NAMES = {".travis.yml", "appveyor.yml", ".appveyor.yml", ".gitlab-ci.yml",
            "azure-pipelines.yml", "jenkinsfile", ".cirrus.yml", "codecov.yml", ".codecov.yml"}
CHANGE_LOGS = {"changelog", "changes", "news", "history", "releases", "release-notes"}
CHANGE_DIRS = {"changelog.d", "changes.d", "newsfragments", "changes", "changelog", "news",
               ".changeset", ".changes"}
LOCKS = ("cargo.lock", "package-lock.json", "yarn.lock", "pnpm-lock.yaml", "poetry.lock",
         "uv.lock", "pipfile.lock", "go.sum", "gemfile.lock", "composer.lock")
CONFIG_EXT = (".ini", ".cfg", ".toml", ".yml", ".yaml", ".json", ".conf", ".editorconfig")


def role(path: str) -> str:
    """One of ROLES: what part of a project a change to `path` is, for grouping and order.
    CI (`.github/`, `.travis.yml`), change logs (`CHANGELOG.md`, `changelog.d/`), dependencies
    (requirements, lock files), other configuration, tests, docs and code."""
    parts = path.lower().split("/")
    name = parts[-1]
    stem = name.split(".")[0]
    if parts[0] in CI_DIRS or name in CI_NAMES:
        return "ci"
    if not name.endswith(CODE_EXT) and (stem in CHANGE_LOGS or
                                        any(p in CHANGE_DIRS for p in parts[:-1])):
        return "changelog"
    if name in LOCKS or "requirements" in parts[:-1] or \
            (name.startswith(("requirements", "constraints")) and name.endswith((".txt", ".in"))):
        return "deps"
    general = kind(path)
    if general == "config" or (general == "code" and (name.startswith(".") or
                                                      name.endswith(CONFIG_EXT))):
        return "config"
    return general


_TEST_AFFIXES = (("test_", "tests_"), ("_test", "_tests", "_spec", "-test", "-spec"))
_GENERIC = {"__init__", "index", "mod", "lib", "main", "__main__", "init"}


def name_key(path: str) -> str:
    """What a file is named for, so that `tests/test_cart.py`, `shop/cart.py`, `shop/cart.pyi`,
    `docs/cart.rst` and `web/cart.test.ts` share one key (`cart`); a generic name (`__init__`,
    `index`, `mod`) takes its folder's."""
    parts = path.lower().split("/")
    base = parts[-1].lstrip(".").split(".")[0]
    prefixes, suffixes = _TEST_AFFIXES
    base = next((base[len(a):] for a in prefixes if base.startswith(a)), base)
    base = next((base[:-len(a)] for a in suffixes if base.endswith(a)), base)
    if base in _GENERIC and len(parts) > 1:
        return parts[-2]
    return base
