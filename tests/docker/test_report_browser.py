"""The report in a real browser, after real Docker runs: the demo reconstructed in the sandbox,
its messy branch verified with a build that prints markup and fails, then `report`. Headless
Chromium (Debian's package) loads the page once for its DOM and once for a screenshot: the page
shows the commits, and no script from the repository's names, subjects or output ran (a run
would change the title or add an element)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli, git
from tests.summary.test_run_summary import NAMES, SUBJECT, hostile_demo

TITLE = "retcon-sandbox report: history-spec.toml"
# A build that, on the commit with the hostile names, prints markup and fails.
MARKUP_BUILD = ("if ls | grep -q onerror; then echo \"<script>document.title='pwned-output'"
                "</script><img src=x onerror=document.title='pwned-output-img'>\"; exit 1; fi")


def chromium() -> str:
    """Debian's Chromium; .ci/run installs it, so only a machine without it skips."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def browse(page: Path, profile: Path, *how: str) -> str:
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", f"--user-data-dir={profile}",
                           "--virtual-time-budget=3000", *how, page.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_report_shows_the_run_and_runs_nothing_of_the_repository(tmp_path: Path) -> None:
    demo = hostile_demo(tmp_path / "repo")
    executed = cli("execute", str(demo.spec), "--non-interactive")
    assert executed.code == 0, executed.out + executed.err
    verified = cli("verify", "main..feature", "--repo", str(demo.path), "--build", MARKUP_BUILD,
                   "--test", "true")
    assert verified.code == 3, verified.out + verified.err
    report = tmp_path / "report.html"
    made = cli("report", str(demo.spec), "-o", str(report))
    assert made.code == 0, made.out + made.err

    dom = browse(report, tmp_path / "profile", "--dump-dom")
    assert f"<title>{TITLE}</title>" in dom  # no script changed it
    assert "pwned" not in dom.split("<body", 1)[0]
    body = dom.split("<body", 1)[1]
    assert "<img" not in body and "<script" not in body and "onerror=\"" not in body
    assert "&lt;script&gt;document.title='pwned-output'&lt;/script&gt;" in body
    assert "&lt;script&gt;document.title='pwned-subject'&lt;/script&gt;" in body
    assert all(name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in body
               for name in NAMES)
    assert body.count("<article") == 4  # the spec's four commits
    for subject in git(demo.path, "log", "--format=%s", "main..feature-clean").splitlines():
        assert subject in body
    assert SUBJECT.startswith("<script>")

    shot = tmp_path / "report.png"
    browse(report, tmp_path / "profile", "--hide-scrollbars", "--window-size=1280,2600",
           f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    print(f"report: {report}\nscreenshot: {shot}")
