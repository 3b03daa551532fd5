"""Files a command is asked to write where it cannot: refused before anything runs when that
can be known (a name too long, a folder that is a file), and when it can only fail at the end (a
full disk, a folder removed meanwhile) reported without losing the run's own verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

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


# --- never through a link, checked before anything runs -----------------------------------------


def test_a_junit_symlink_the_branch_ships_is_refused_before_anything_runs(
        demo: Demo, tmp_path: Path) -> None:
    """The checkout holds `junit.xml`, a symlink to a file outside it: `verify --junit junit.xml`
    refuses it at once, and the file it points to is never written."""
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (demo.path / "junit.xml").symlink_to(outside)
    result = cli("verify", "main..feature~8", *LOCAL, "--build", "true", "--junit", "junit.xml",
                 cwd=demo.path)
    assert result.code == 2, result.out + result.err
    assert "--junit junit.xml is a symbolic link, not a regular file" in result.err
    assert "Verifying" not in result.out and "passed" not in result.out
    assert outside.read_text() == "precious\n" and (demo.path / "junit.xml").is_symlink()


@pytest.mark.parametrize("where", ["/proc/junit.xml", "/proc"])
def test_a_junit_path_no_file_can_be_made_in_is_refused_before_anything_runs(
        demo: Demo, where: str) -> None:
    result = cli("verify", "main..feature~8", *LOCAL, "--build", "echo ran", "--junit", where,
                 cwd=demo.path)
    assert result.code == 2, result.out + result.err
    assert f"--junit {where}" in result.err and "Verifying" not in result.out
    assert "internal error" not in result.err


def test_a_junit_report_replaces_a_file_whole_and_never_a_link_made_meanwhile(
        demo: Demo, tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text("an old report\n")
    inode = report.stat().st_ino
    result = cli("verify", "main..feature~8", *LOCAL, "--build", "true", "--junit",
                 str(report), cwd=demo.path)
    assert result.code == 0, result.out + result.err
    assert report.read_text().startswith("<?xml") and report.stat().st_ino != inode  # renamed
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    report.unlink()
    # the build (on the host, with the local backend) plants a link where the report goes
    result = cli("verify", "main..feature~8", *LOCAL, "--build",
                 f"ln -sf '{outside}' '{report}'", "--junit", str(report), cwd=demo.path)
    shown = result.out + result.err
    assert result.code == 0, shown
    assert f"the JUnit report {report} was not written: --junit {report} is a symbolic link" \
        in shown
    assert outside.read_text() == "precious\n" and report.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_demo_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    result = cli("demo", *LOCAL, "--directory", str(link))
    assert result.code == 2, result.out + result.err
    assert f"{link} is a symbolic link; the demo never writes through one" in result.err
    assert not any(target.iterdir())
