"""`execute --summary FILE`: the Markdown job summary of a reconstruction, on a messy branch
whose names and subjects are hostile, rendered by GitHub's renderer (see
tests/commands/test_summary.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.commands.test_summary import OUR_TAGS, render, tags
from tests.conftest import Demo, cli, make_demo

LOCAL = ("--sandbox", "local", "--non-interactive")
# Names and a subject that would run script if shown as markup; `/` cannot be in a name.
NAMES = ("<img src=x onerror=document.title='pwned-name'>.txt",
         "<script>document.title='pwned-script'.txt", "quote\" onclick=\"x.txt")
SUBJECT = ("<script>document.title='pwned-subject'</script>"
           "<img src=x onerror=document.title='pwned-img'> [l](http://x) | ``")


def hostile_demo(directory: Path) -> Demo:
    """The demo, whose messy branch ends with a commit adding files with hostile names under
    a hostile subject, then one more (no spec commit takes them: they go to the catch-all
    commit)."""
    demo = make_demo(directory, with_paths=True)
    demo.git("checkout", "-q", "feature")
    for name in NAMES:
        (demo.path / name).write_text("hostile\n")
    demo.git("add", "--", *NAMES)
    subprocess.run(["git", "-C", str(demo.path), "commit", "-q", "-m", SUBJECT], check=True)
    with (demo.path / "README.md").open("a") as readme:
        readme.write("\nMore.\n")
    demo.git("commit", "-qam", "readme")
    demo.git("checkout", "-q", "main")
    return demo


@pytest.mark.slow
def test_execute_appends_a_summary_of_both_histories_and_each_commit(tmp_path: Path) -> None:
    demo = hostile_demo(tmp_path / "repo")
    summary = tmp_path / "summary.md"
    result = cli("execute", str(demo.spec), *LOCAL, "--summary", str(summary))
    assert result.code == 0, result.out + result.err
    markdown = summary.read_text(encoding="utf-8")
    assert markdown.startswith("## retcon-sandbox execute `history-spec.toml`\n")
    assert "**✓ Complete (4 of 4 logical commits, 5 commits, 0 fixes)**" in markdown
    assert "Tree check: cleaned == source ✓" in markdown
    assert re.search(r"\| 1 \| `[0-9a-f]{7}` \| PASS \d\.\d s \| PASS \d\.\d s \| 0 \|", markdown)
    assert "| messy: `feature` (12 commits) | clean: `feature-clean` (5 commits) |" in markdown
    assert "**Time** of the last run: " in markdown
    html = render(markdown)
    assert tags(html) <= OUR_TAGS and "<a " not in html and "<img" not in html
    assert "&lt;script&gt;document.title='pwned-subject'&lt;/script&gt;" in html


def test_a_summary_target_is_checked_before_anything_runs(demo: Demo, tmp_path: Path) -> None:
    link = tmp_path / "summary.md"
    link.symlink_to(tmp_path / "elsewhere.md")
    result = cli("execute", str(demo.spec), *LOCAL, "--summary", str(link))
    assert result.code == 2 and "--summary" in result.err and "symbolic link" in result.err
    assert "feature-clean" not in demo.git("branch")
    assert not (tmp_path / "elsewhere.md").exists()
