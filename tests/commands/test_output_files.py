"""Files a command is asked to write where it cannot: refused before anything runs when that
can be known (a name too long, a folder that is a file), and when it can only fail at the end (a
full disk, a folder removed meanwhile) reported without losing the run's own verdict."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Demo, cli

LOCAL = ("--sandbox", "local")
LONG = "d" * 300  # over NAME_MAX


def test_a_junit_report_that_cannot_be_written_keeps_the_verdict(demo: Demo,
                                                                 tmp_path: Path) -> None:
    """The build removes the report's folder: the file cannot be written at the end."""
    reports = tmp_path / "reports"
    reports.mkdir()
    junit = reports / "j.xml"
    result = cli("verify", "main..feature~8", *LOCAL, "--build", f"rm -rf '{reports}'",
                 "--junit", str(junit), cwd=demo.path)
    shown = result.out + result.err
    assert result.code == 0, shown
    assert f"the JUnit report {junit} was not written: No such file or directory" in shown
    assert "The exit code is still the verification's own (0)" in shown
    assert "2 commits: 2 passed" in shown and "internal error" not in shown


def test_a_junit_path_with_a_name_too_long_is_a_usage_error(demo: Demo, tmp_path: Path) -> None:
    result = cli("verify", "main..feature~8", *LOCAL, "--build", "true",
                 "--junit", str(tmp_path / LONG / "j.xml"), cwd=demo.path)
    assert result.code == 2, result.out + result.err
    assert "File name too long" in result.err and "Traceback" not in result.err


def test_a_demo_folder_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for directory, message in ((afile, f"{afile} exists and is not a folder"),
                               (afile / "sub", "Not a directory"),
                               (tmp_path / LONG, "File name too long")):
        result = cli("demo", *LOCAL, "--directory", str(directory))
        assert result.code == 2, result.out + result.err
        assert message in result.err and "Give --directory a new or empty folder" in result.err
        assert "internal error" not in result.err
