"""Repository-relative paths, validated on the host before anything uses them."""

from __future__ import annotations


class PathRefused(ValueError):
    pass


def repo_path(path: str) -> str:
    """Normalise a repository-relative path; refuse absolute paths, `..`, `.git` and NUL bytes."""
    if not isinstance(path, str) or not path.strip():
        raise PathRefused("expected a non-empty path relative to the repository")
    if "\0" in path:
        raise PathRefused("the path contains a NUL byte")
    if path.startswith("/"):
        raise PathRefused("absolute paths are refused: give a path relative to the repository")
    parts = [p for p in path.strip().split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused("`..` is refused: paths stay inside the repository")
    if any(p.lower() == ".git" for p in parts):
        raise PathRefused("paths inside .git are refused")
    if not parts:
        raise PathRefused("the path names the repository root, not a file")
    return "/".join(parts)


def matches(path: str, patterns: tuple[str, ...]) -> bool:
    """A file matches a `paths` entry naming it or a directory above it."""
    return any(path == p or path.startswith(p + "/") for p in patterns)
