"""Untrusted text inside Markdown and HTML: the job summary (`--summary FILE`) and the report
(`retcon-sandbox report`) show subjects, file names and output from the repository, which may be
written to look like markup.

Everything first goes through `text.sanitize` (no terminal control, no bidirectional or invisible
character, a byte that is not UTF-8 shown as `\\xNN`). In HTML the markup characters are then
escaped (`html.escape`), and what HTML cannot carry (a lone surrogate, a noncharacter) is shown
escaped too. In Markdown a value is a code span, the one construct in which nothing is read as
Markdown or HTML (no link, image, tag, emphasis or autolink), fenced with more backticks than it
holds; in a table its `|` is escaped, so it cannot end the cell. Text of several lines goes in a
`<pre>` element whose content is HTML-escaped: GitHub renders it as it is.
"""

from __future__ import annotations

import html
import re

from retcon_sandbox.text import sanitize, sanitize_name

_NOT_HTML = re.compile("[\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]")
_BACKTICKS = re.compile("`+")


def _visible(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def html_text(text: str, one_line: bool = False) -> str:
    """Text for an HTML element's content or a quoted attribute's value."""
    shown = sanitize_name(text) if one_line else sanitize(text)
    return html.escape(_NOT_HTML.sub(_visible, shown), quote=True)


def md_code(text: str, cell: bool = False) -> str:
    """A one-line value as a Markdown code span (empty text: nothing); `cell`: inside a table
    row, where `|` would end the cell."""
    shown = _NOT_HTML.sub(_visible, sanitize_name(text))
    if not shown:
        return ""
    if cell:
        shown = shown.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(shown)), default=0) + 1)
    pad = " " if shown[0] in "` " or shown[-1] in "` " else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def md_pre(text: str) -> str:
    """Text of several lines (a failure's output, a stuck summary), shown as it is."""
    return f"<pre>{html_text(text.strip(chr(10)))}</pre>"
