"""Repository-relative paths and path patterns, validated on the host before anything uses them.

Two kinds of names reach us. Names the model gives (tool calls) are refused when they are
absolute, climb out with `..`, contain control characters, or name `.git` or anything git treats
as `.git` (any case, with HFS-ignorable characters, NTFS short names, trailing dots or spaces).
Names that come from the repository are carried exactly, whatever their bytes, but a path git
would treat as `.git` is never committed (see `dotgit_component`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

# Code points HFS+ ignores when comparing names; git refuses ".git" spelled with any of them.
_HFS_IGNORABLE = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                *range(0x206A, 0x2070), 0xFEFF])
_GLOB_CHARS = re.compile(r"[*?\[]")


class PathRefused(ValueError):
    pass


def dotgit_component(name: str) -> bool:
    """Whether git treats this path component as `.git` on some filesystem."""
    folded = name.translate(_HFS_IGNORABLE).casefold()
    if folded == ".git" or folded == "git~1":
        return True
    if folded.startswith(".git"):  # NTFS: ".git." ".git  " ".git::$INDEX_ALLOCATION"
        rest = folded[4:]
        return rest.strip(". ") == "" or rest.startswith(":")
    return False


def control_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) == "Cc":
            return f"U+{ord(char):04X}"
    return None


def not_unicode(text: str, names: bool = False) -> str | None:
    """Where `text` cannot be written as UTF-8, as "U+D800 at character 3": its first lone
    surrogate (a JSON `\\ud800` escape without its pair, say); None when it can. With `names`,
    a surrogate that stands for a byte of a file name that is not UTF-8 (U+DC80 to U+DCFF, as
    `os.fsdecode` makes them) is one it can."""
    try:
        text.encode("utf-8", "surrogateescape" if names else "strict")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X} at character {exc.start + 1}"
    return None


def parents(path: str) -> list[str]:
    """The folders a repository path is in, outermost first: `a/b/c` -> `a`, `a/b`."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def repo_path(path: str) -> str:
    """Normalise a repository-relative path the model gave, or refuse it."""
    if not isinstance(path, str) or not path.strip():
        raise PathRefused("expected a non-empty path relative to the repository")
    surrogate = not_unicode(path, names=True)
    if surrogate:
        raise PathRefused(f"the path holds a lone surrogate ({surrogate}), which no file name "
                          "can hold: write each character itself (a byte that is not UTF-8 as "
                          "\\xNN, as file lists show it)")
    bad = control_character(path)
    if bad:
        raise PathRefused(f"the path contains a control character ({bad}); file names with "
                          "control characters cannot be written through the tools")
    if path.startswith("/"):
        raise PathRefused("absolute paths are refused: give a path relative to the repository")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused("`..` is refused: paths stay inside the repository")
    if any(dotgit_component(p) for p in parts):
        raise PathRefused("paths inside .git (or names git treats as .git) are refused")
    if not parts:
        raise PathRefused("the path names the repository root, not a file")
    return "/".join(parts)


def pattern(text: str) -> str:
    """Normalise a `paths` entry (a path, a directory or a glob pattern), or refuse it."""
    bad = control_character(text)
    if bad:
        raise PathRefused(f"contains a control character ({bad})")
    if text.startswith("/"):
        raise PathRefused("give a path relative to the repository root (no leading /)")
    parts = [p for p in text.strip().split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused("`..` is refused: paths stay inside the repository")
    if not parts:
        raise PathRefused("names the repository root; list paths or patterns inside it")
    return "/".join(parts)


def _glob_regex(glob: str) -> str:
    """git's glob rules (pathspec `:(glob)`): `*` and `?` stay within a component, `**/`
    matches any number of directories, `/**` everything below."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("(?:/.*)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[":
            end = glob.find("]", i + 2)
            if end < 0:
                out.append(re.escape("["))
                i += 1
                continue
            body = glob[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = re.sub(r"([\\\]])", r"\\\1", body[1:] if negate else body)
            out.append(f"[{'^/' if negate else ''}{body}]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Patterns:
    """A commit's `paths`: files, directories (everything below them) and glob patterns. A
    pattern without `/` matches at any depth, as in .gitignore (`*.md` is every Markdown file)."""

    items: tuple[str, ...]

    @cached_property
    def _compiled(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        compiled = []
        for item in self.items:
            if not _GLOB_CHARS.search(item):
                regex = re.escape(item) + "(?:/.*)?"
            elif "/" not in item:
                regex = "(?:.*/)?" + _glob_regex(item) + "(?:/.*)?"
            else:
                regex = _glob_regex(item) + "(?:/.*)?"
            compiled.append((item, re.compile(regex, re.DOTALL)))
        return tuple(compiled)

    def matches(self, path: str) -> bool:
        return any(regex.fullmatch(path) for _, regex in self._compiled)

    def unmatched(self, paths: Iterable[str]) -> list[str]:
        """The items that match none of `paths`."""
        left = dict(self._compiled)
        for path in paths:
            for item, regex in list(left.items()):
                if regex.fullmatch(path):
                    del left[item]
            if not left:
                break
        return list(left)
