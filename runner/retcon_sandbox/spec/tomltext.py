"""Byte-preserving edits of the spec's TOML text.

The spec is the user's file: a save may only add one history entry, and everything else (comments,
layout, quoting, CRLF line endings, a UTF-8 byte-order mark) must stay byte for byte. So instead of
re-serialising a document, this module scans the text for the structure it needs (the
`[[commit]]` tables, each table's last key line and its `history` array) and splices the new
entry in as text. `tomllib` remains the judge of what the text means: the spec module checks
every splice by parsing the changed table again.

The scanner is driven by regular expressions, so a spec of tens of megabytes is scanned in well
under a second, and after a splice only the changed table is scanned again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

_WS = re.compile(r"[ \t]*")
_GAP = re.compile(r"(?:[ \t\r\n]+|#[^\r\n]*)*")  # whitespace, newlines and comments
_REST_OF_LINE = re.compile(r"[ \t]*(?:#[^\r\n]*)?")
_STRING = re.compile(
    r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*"""(?:"{0,2})'
    r"|'''[\s\S]*?'''(?:'{0,2})"
    r'|"(?:[^"\\\r\n]|\\[^\r\n])*"'
    r"|'[^'\r\n]*'"
)
_BARE = re.compile(r"[A-Za-z0-9_\-+:.]+")
_TIME = re.compile(r"[ \t]+\d{2}:\d{2}[0-9:.Zz+\-]*")  # the time part of a date-time
_KEY_PART = re.compile(r'[A-Za-z0-9_\-]+|"(?:[^"\\\r\n]|\\[^\r\n])*"|\'[^\'\r\n]*\'')


class TomlScanError(ValueError):
    """The text has a shape the scanner does not follow (tomllib explains real syntax errors)."""


@dataclass(frozen=True)
class History:
    open: int  # offset of "["
    close: int  # offset of "]"
    last_start: int | None  # offset of the last element; None when empty
    last_end: int | None  # offset just after the last element; None when empty
    comma: int | None  # offset of the comma after the last element, if any
    multiline: bool


@dataclass(frozen=True)
class CommitTable:
    header: int  # offset of "[[commit]]"
    end: int  # offset where the table's text ends (the next header, or the end of the text)
    last_line_end: int  # end of the line holding the table's last key (before its newline)
    history: History | None


@dataclass(frozen=True)
class Layout:
    commits: tuple[CommitTable, ...]


def newline_of(text: str) -> str:
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


class _Scanner:
    def __init__(self, text: str, start: int = 0, end: int | None = None) -> None:
        self.text = text
        self.pos = start
        self.end = len(text) if end is None else end

    def fail(self, what: str) -> TomlScanError:
        line = self.text.count("\n", 0, self.pos) + 1
        return TomlScanError(f"line {line}: {what}")

    def at(self, chars: str) -> bool:
        return self.pos < self.end and self.text[self.pos] in chars

    def skip(self, pattern: re.Pattern[str]) -> None:
        match = pattern.match(self.text, self.pos, self.end)
        if match:
            self.pos = match.end()

    def key(self) -> str:
        """A dotted key, as written; returns the first part unquoted when it is the only one."""
        parts = []
        while True:
            self.skip(_WS)
            match = _KEY_PART.match(self.text, self.pos, self.end)
            if not match:
                raise self.fail("expected a key")
            parts.append(match.group().strip("\"'"))
            self.pos = match.end()
            self.skip(_WS)
            if not self.at("."):
                return ".".join(parts) if len(parts) > 1 else parts[0]
            self.pos += 1

    def value(self) -> None:
        self.skip(_WS)
        if self.at("["):
            self.array()
        elif self.at("{"):
            self.inline_table()
        else:
            match = _STRING.match(self.text, self.pos, self.end) or \
                _BARE.match(self.text, self.pos, self.end)
            if not match:
                raise self.fail("expected a value")
            self.pos = match.end()
            self.skip(_TIME)

    def array(self) -> History:
        opened = self.pos
        self.pos += 1
        last_start: int | None = None
        last_end: int | None = None
        comma: int | None = None
        while True:
            self.skip(_GAP)
            if self.at("]"):
                close = self.pos
                self.pos += 1
                multiline = "\n" in self.text[opened:close]
                return History(opened, close, last_start, last_end, comma, multiline)
            if comma is None and last_end is not None:
                raise self.fail("expected `,` or `]` in an array")
            last_start = self.pos
            self.value()
            last_end, comma = self.pos, None
            self.skip(_GAP)
            if self.at(","):
                comma = self.pos
                self.pos += 1

    def inline_table(self) -> None:
        self.pos += 1
        while True:
            self.skip(_GAP)
            if self.at("}"):
                self.pos += 1
                return
            self.key()
            if not self.at("="):
                raise self.fail("expected `=` in an inline table")
            self.pos += 1
            self.value()
            self.skip(_GAP)
            if self.at(","):
                self.pos += 1

    def header(self) -> tuple[bool, str]:
        """At "[": (is an array of tables, the table's name)."""
        double = self.text.startswith("[[", self.pos)
        self.pos += 2 if double else 1
        name = self.key()
        closing = "]]" if double else "]"
        if not self.text.startswith(closing, self.pos):
            raise self.fail(f"expected `{closing}`")
        self.pos += len(closing)
        return double, name

    def line_end(self) -> int:
        """After a key's value: skip spaces and a comment; the offset of the line's end."""
        self.skip(_REST_OF_LINE)
        if self.pos < self.end and self.text[self.pos] not in "\r\n":
            raise self.fail("expected the end of the line")
        return self.pos


@dataclass
class _Open:
    """The [[commit]] table being scanned."""

    header: int
    last_line_end: int
    history: History | None = None

    def closed(self, end: int) -> CommitTable:
        return CommitTable(self.header, end, self.last_line_end, self.history)


def scan(text: str, start: int = 0, end: int | None = None) -> Layout:
    """The `[[commit]]` tables of `text[start:end]` (offsets into `text`)."""
    scanner = _Scanner(text, start, end)
    commits: list[CommitTable] = []
    current: _Open | None = None
    while True:
        scanner.skip(_GAP)
        if scanner.pos >= scanner.end:
            break
        here = scanner.pos
        if scanner.at("["):
            double, name = scanner.header()
            scanner.line_end()
            if current is not None:
                commits.append(current.closed(here))
            current = _Open(here, scanner.pos) if double and name == "commit" else None
            continue
        key = scanner.key()
        if not scanner.at("="):
            raise scanner.fail("expected `=` after a key")
        scanner.pos += 1
        scanner.skip(_WS)
        array = None
        if key == "history" and current is not None and scanner.at("["):
            array = scanner.array()
        else:
            scanner.value()
        line_end = scanner.line_end()
        if current is not None:
            current.last_line_end = line_end
            if array is not None:
                current.history = array
    if current is not None:
        commits.append(current.closed(scanner.end))
    return Layout(tuple(commits))


def _line_indent(text: str, offset: int) -> str | None:
    """The whitespace before `offset` on its line, if nothing else precedes it there."""
    line_start = text.rfind("\n", 0, offset) + 1
    before = text[line_start:offset]
    return before if not before.strip(" \t") else None


def insertion(text: str, table: CommitTable, item: str) -> list[tuple[int, str]]:
    """The splices (offset, text), in increasing order, that append `item` (a TOML value) to the
    table's history, creating `history = [...]` after its last key line if there is none."""
    nl = newline_of(text)
    history = table.history
    if history is None:
        return [(table.last_line_end, f"{nl}history = [{nl}    {item},{nl}]")]
    if history.last_start is None or history.last_end is None:  # `[]`, or only comments inside
        if history.multiline:
            indent = _line_indent(text, history.close)
            if indent is not None:
                return [(history.close - len(indent), f"{indent}    {item},{nl}")]
            return [(history.close, f"{nl}    {item},{nl}")]
        return [(history.open + 1, f"{nl}    {item},{nl}")]
    if not history.multiline:
        return [(history.last_end, f", {item}")]
    indent = _line_indent(text, history.last_start) or "    "
    splices = [] if history.comma is not None else [(history.last_end, ",")]
    after = history.comma + 1 if history.comma is not None else history.last_end
    rest = _REST_OF_LINE.match(text, after)
    line_end = rest.end() if rest else after
    if line_end < len(text) and text[line_end] in "\r\n":
        return [*splices, (line_end, f"{nl}{indent}{item},")]
    return [*splices, (history.close, f"{nl}{indent}{item},{nl}")]  # "…last ]" on one line


def apply(text: str, splices: list[tuple[int, str]]) -> str:
    out, last = [], 0
    for offset, piece in splices:
        out += [text[last:offset], piece]
        last = offset
    out.append(text[last:])
    return "".join(out)


def shifted(table: CommitTable, delta: int) -> CommitTable:
    history = table.history
    if history is not None:
        history = History(history.open + delta, history.close + delta,
                          None if history.last_start is None else history.last_start + delta,
                          None if history.last_end is None else history.last_end + delta,
                          None if history.comma is None else history.comma + delta,
                          history.multiline)
    return replace(table, header=table.header + delta, end=table.end + delta,
                   last_line_end=table.last_line_end + delta, history=history)


REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_text(value: str) -> str:
    """`value` as a UTF-8 file can hold it: each lone surrogate (a model's unpaired `\\ud800`
    escape, a byte a terminal sent that was not UTF-8) becomes U+FFFD, the replacement
    character, as a decoder shows what it could not read. TOML has no escape for a lone
    surrogate, and a visible `\\udXXX` would read back as other text."""
    return _SURROGATE.sub(REPLACEMENT, value)


# Written as \uXXXX escapes, though TOML allows them as they are: C1 controls, and the
# bidirectional and invisible characters `text.sanitize` escapes (a U+202E in a file name would
# reorder the spec's line in an editor or a terminal).
_ESCAPED = re.compile("[\x80-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
                      "\u2066-\u206f\ufeff\ufff9-\ufffb]")


def basic_string(value: str) -> str:
    """A TOML basic string: one line, every control, bidirectional or invisible character
    escaped, any lone surrogate written U+FFFD (`unicode_text`): it never fails, whatever the
    str, and reads back as that str (but for the surrogates)."""
    out = ['"']
    for char in unicode_text(value):
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) < 0x20 or ord(char) == 0x7F or _ESCAPED.match(char):
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)
