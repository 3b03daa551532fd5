"""`--summary FILE`: the Markdown job summary of `verify` (and `execute`, see
tests/summary), rendered by GitHub's own Markdown renderer (cmark-gfm, from Debian, with the
extensions GitHub enables) so that what a hostile repository names and prints is shown as text:
no tag, link, image or table cell of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.markup import html_text, md_code, md_pre
from retcon_sandbox.verify.ci import markdown_summary
from tests.commands.test_verify_ci import (
    BOOM_BUILD,
    HOSTILE,
    LOCAL,
    failing,
    hostile_commit,
    passing,
)
from tests.conftest import Demo, cli

# What the summary itself writes; anything else in the rendered HTML came from the repository.
OUR_TAGS = {"h2", "h3", "p", "strong", "table", "thead", "tbody", "tr", "th", "td", "code",
            "details", "summary", "pre", "ul", "li", "br"}
# A subject that tries every way out: a tag, an image, a link, an autolink, emphasis, a
# table cell, a code span's end, an entity, a newline.
SUBJECT = ("<img src=x onerror=alert(1)> ![i](http://x/i.png) [l](http://x) https://evil.example "
           "*em* | cell ``` ` &amp; <script>alert(2)</script>\nnext")


def cmark_gfm() -> str:
    """GitHub's renderer; installed by .ci/run, so only a machine without it skips."""
    found = shutil.which("cmark-gfm")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("cmark-gfm is not installed (apt-get install cmark-gfm)")
        pytest.skip("cmark-gfm is not installed (apt-get install cmark-gfm)")
    return found


def render(markdown: str) -> str:
    """The HTML GitHub's renderer makes, raw HTML kept (GitHub sanitises after this)."""
    proc = subprocess.run([cmark_gfm(), "--unsafe", "-e", "table", "-e", "autolink", "-e",
                           "strikethrough", "-e", "tagfilter"], input=markdown,
                          capture_output=True, text=True, check=True)
    return proc.stdout


def tags(html: str) -> set[str]:
    return {t.lower() for t in re.findall(r"</?([A-Za-z][A-Za-z0-9]*)", html)}


def test_a_value_is_a_code_span_that_nothing_ends_early() -> None:
    assert md_code("a`b") == "``a`b``"
    assert md_code("`x`") == "`` `x` ``"
    assert md_code("a|b", cell=True) == "`a\\|b`"
    assert md_code("two\nlines\x1b[2J") == "`two\\nlines\\e[2J`"
    assert md_code("") == ""
    assert md_pre("<b>&\n") == "<pre>&lt;b&gt;&amp;</pre>"
    assert html_text("\ud800 \ufffe <\"'>") == "\\ud800 \\ufffe &lt;&quot;&#x27;&gt;"


def test_githubs_renderer_shows_hostile_subjects_and_output_as_text() -> None:
    tail = HOSTILE.decode("utf-8", "surrogateescape") + "\n</pre><script>alert(3)</script>"
    rows = [passing(1), failing(2, tail, SUBJECT)]
    rows[0].subject = SUBJECT
    markdown = markdown_summary("main..<b>feature</b>", rows, 1.5,
                                {"build": True, "test": False})
    html = render(markdown)
    assert tags(html) <= OUR_TAGS, tags(html) - OUR_TAGS
    assert "<a " not in html and "<img" not in html and "<script" not in html
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows_html = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    assert len(rows_html) == 2 and all(r.count("<td") == 7 for r in rows_html)
    assert "&lt;img src=x onerror=alert(1)&gt;" in rows_html[0]
    assert "| cell" in rows_html[0] and "\\nnext" in rows_html[0]
    assert "<td>FAIL</td>\n<td>none</td>" in rows_html[1]
    assert "&lt;/pre&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in html
    assert "::add-mask::secret" in html and "\\e]52;c;eA==\\x07" in html
    assert "11 commits" not in html and "2 commits: 1 passed, 1 failed (1 cached)" in html


@pytest.mark.slow
def test_verify_appends_its_summary_to_the_file(demo: Demo, tmp_path: Path) -> None:
    subject = hostile_commit(demo)
    summary = tmp_path / "step-summary.md"
    summary.write_text("an earlier step's summary\n")
    result = cli("verify", "main..feature", *BOOM_BUILD, "--summary", str(summary), *LOCAL,
                 cwd=demo.path)
    assert result.code == 3, result.out + result.err
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("an earlier step's summary\n## retcon-sandbox verify `main..feature`")
    assert "**✗ 11 commits: 10 passed, 1 failed, in " in text
    assert text.count("\n| ") == 12  # the header and one row per commit
    assert md_code(subject, cell=True) in text
    html = render(text)
    assert tags(html) <= OUR_TAGS and "<details><summary>#11 " in html
    assert "::add-mask::secret\n::error title=fake::forged</pre>" in html


def test_a_summary_target_that_is_no_regular_file_is_refused_before_anything_runs(
        demo: Demo, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "summary.md"
    link.symlink_to(victim)
    for target in (link, tmp_path, tmp_path / "missing" / "s.md"):
        result = cli("verify", "main..feature", *BOOM_BUILD, "--summary", str(target), *LOCAL,
                     cwd=demo.path)
        assert result.code == 2, result.out + result.err
        assert "--summary" in result.err and "Verifying" not in result.out
    assert victim.read_text() == "precious\n"
    assert "a symbolic link" in cli("verify", "main..feature", *BOOM_BUILD, "--summary",
                                    str(link), *LOCAL, cwd=demo.path).err
