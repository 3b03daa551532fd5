"""The job summary of `execute --summary FILE` and the HTML report of `retcon-sandbox report`:
what they show, that a hostile repository's names, subjects and outputs stay text in them, and
that the report's output file is checked first and never written through a link. (The report
in a real browser, after a real Docker run: tests/docker/test_report_browser.py.)"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from retcon_sandbox.summary.facts import Commit, Facts, FileStat, Flag, Logical, Span, Timeline
from retcon_sandbox.summary.html import CSS, STYLE_HASH, page
from retcon_sandbox.verify.cache import Outcome, Stage
from tests.conftest import Demo, cli
from tests.summary.test_run_summary import LOCAL, NAMES, SUBJECT, hostile_demo


class Page(HTMLParser):
    """Every start tag with its attributes, the text, and the <style> and <title> content."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.inside: list[str] = []
        self.style = ""
        self.title = ""
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.inside.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.inside:
            del self.inside[len(self.inside) - 1 - self.inside[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.inside[-1:] == ["style"]:
            self.style += data
        if self.inside[-1:] == ["title"] and "svg" not in self.inside:
            self.title += data


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p",
             "div", "b", "span", "section", "ol", "ul", "li", "code", "details", "summary",
             "table", "tr", "th", "td", "article", "dl", "dt", "dd", "pre", "br", "svg", "line",
             "text", "rect", "i", "footer"}


def check_inert(text: str) -> Page:
    """The page runs nothing and loads nothing: only our own tags, no event handler, no URL,
    and a policy that allows the one style by its hash."""
    parsed = Page(text)
    assert {t for t, _ in parsed.tags} <= PAGE_TAGS, {t for t, _ in parsed.tags} - PAGE_TAGS
    for tag, attrs in parsed.tags:
        assert not any(a.startswith("on") or a in ("href", "src", "style", "srcdoc", "action")
                       for a in attrs), (tag, attrs)
    (policy,) = [a["content"] for t, a in parsed.tags
                 if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert policy is not None and policy.startswith("default-src 'none'; ")
    assert f"style-src 'sha256-{STYLE_HASH}'" in policy and "script-src" not in policy
    assert parsed.style == CSS
    return parsed


def synthetic() -> Facts:
    bad = SUBJECT + "\n\x1b[31m\ud800"
    passed = Outcome((Stage("build", "make", "PASS", True, False, 0.25),
                      Stage("test", "pytest", "PASS", True, False, 1.5)), None, "", 600.0)
    failed = Outcome((Stage("build", "make", "FAIL (exit 1)", False, False, 0.5),), "Build "
                     "FAIL (exit 1) in 0.5s <b>", "</pre><script>alert(1)</script>\n" + bad,
                     600.0, claimed=True)
    clean = (Commit("a" * 40, "1" * 40, bad, (FileStat(NAMES[0], 3, 1), FileStat(NAMES[2], 1, 0),
                                              FileStat(NAMES[1], None, None)), passed, 1),)
    messy = (Commit("b" * 40, "2" * 40, bad, (FileStat(NAMES[2], 1, 0),), failed),)
    flag = Flag(NAMES[0], True, "new file", 2, "<img src=x onerror=alert(2)>")
    item = Logical(1, bad, "stuck", ("a" * 40,), 1, 1234, (flag,), "<b>summary</b>")
    spans = (Span("model", 0.0, 2.0, NAMES[1]), Span("build", 2.0, 0.25, "#1 build"))
    return Facts("spec.toml", clean, messy, (item,), "feat<i>", "main", "clean<b>", "c" * 40,
                 True, 0, Timeline(1.7e9, 3.0, spans), ("make", "pytest"))


def test_the_page_is_inert_and_shows_hostile_text_as_text() -> None:
    text = page(synthetic())
    parsed = check_inert(text)
    shown = "".join(parsed.text)
    for name in NAMES:
        assert name in shown
    assert "<script>document.title='pwned-subject'</script>" in shown
    assert "</pre><script>alert(1)</script>" in shown and "\\e[31m" in shown
    assert "\\ud800" in shown and "<img src=x onerror=alert(2)>" in shown
    assert "⚠" in shown and "new file, +2 lines" in shown and "1,234" in shown
    assert "FAIL (exit 1) 0.5 s (claim)" in shown and "PASS 1.5 s" in shown
    assert parsed.title == "retcon-sandbox report: spec.toml"
    assert len([t for t, a in parsed.tags if t == "rect"]) == 2


@pytest.mark.slow
def test_the_report_shows_both_histories_and_the_spec_commits(tmp_path: Path) -> None:
    demo = hostile_demo(tmp_path / "repo")
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    report = tmp_path / "report.html"
    made = cli("report", str(demo.spec), "-o", str(report))
    assert made.code == 0, made.out + made.err
    assert f"Report written: {report} (5 commit(s) beside 12 messy one(s); " in made.out
    parsed = check_inert(report.read_text(encoding="utf-8"))
    shown = "".join(parsed.text)
    subjects = demo.git("log", "--format=%s", "main..feature-clean").splitlines()
    assert all(s in shown for s in subjects) and SUBJECT in shown
    assert all(name in shown for name in NAMES)
    assert "Remaining changes from feature" in shown and "Where the time went" in shown
    assert len([t for t, a in parsed.tags if t == "article"]) == 4
    assert len([t for t, a in parsed.tags if t == "rect"]) >= 8  # sandboxes, builds, tests
    again = cli("report", str(demo.spec), "-o", str(report))
    assert again.code == 2 and "exists" in again.err
    assert cli("report", str(demo.spec), "-o", str(report), "--force").code == 0


@pytest.mark.slow
def test_a_report_of_a_verified_range(demo: Demo, tmp_path: Path) -> None:
    verified = cli("verify", "main..feature~8", "--build", "true", "--test", "true",
                   "--sandbox", "local", cwd=demo.path)
    assert verified.code == 0, verified.out + verified.err
    report = tmp_path / "range.html"
    made = cli("report", "--range", "main..feature", "-o", str(report), cwd=demo.path)
    assert made.code == 0, made.out + made.err
    assert "(10 commit(s); 2 with a recorded result)" in made.out
    shown = "".join(check_inert(report.read_text(encoding="utf-8")).text)
    assert "main..feature" in shown and "WIP discounts" in shown and "PASS" in shown
    assert "not recorded" in shown and "Where the time went" not in shown


def test_the_output_is_checked_first_and_never_written_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.html"
    victim.write_text("precious\n")
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    missing_spec = str(tmp_path / "no-such-spec.toml")
    for args in ((), ("--force",)):
        refused = cli("report", missing_spec, "-o", str(link), *args)
        assert refused.code == 2 and "-o" in refused.err and "symbolic link" in refused.err
    exists = cli("report", missing_spec, "-o", str(victim))
    assert exists.code == 2 and "exists" in exists.err and "--force" in exists.err
    folder = cli("report", missing_spec, "-o", str(tmp_path))
    assert folder.code == 2 and "a directory" in folder.err
    assert victim.read_text() == "precious\n" and link.is_symlink()
    nothing = cli("report", "-o", str(tmp_path / "new.html"))
    assert nothing.code == 2 and "needs a spec or a revision range" in nothing.err
    assert not (tmp_path / "new.html").exists()
