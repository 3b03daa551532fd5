"""The commit-subject check that .ci/run calls (.ci/commit_subjects.py), on real repositories:
it judges only the commits after the base, merges included, and says what to do when a clone
cannot show which commits those are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, git

SCRIPT = ROOT / ".ci" / "commit_subjects.py"
GOOD = ["verify --junit: refuse a symlink target", "plan: weigh co-change by commit size",
        "Add CONTRIBUTING.md", "docs: embed the CI recipe", "ci: pass the base commit along",
        "x" * 72]
BAD = {  # subject: what the check must say
    "x" * 73: "73 characters (at most 72)",
    "plan: weigh co-change by commit size.": "ends with a period",
    "Added the commit check": "starts with 'added'",
    "verify: fixes the table width": "starts with 'fixes'",
    "README: adding the architecture page": "starts with 'adding'",
    "CHANGELOG: the fixes from this round's reviews": "starts with 'the'",
    "fixup! plan: weigh co-change by commit size": "a work-in-progress commit",
    "WIP": "a work-in-progress commit",
}


def commit(repo: Path, subject: str) -> str:
    git(repo, "commit", "-q", "--allow-empty", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


def check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=repo, capture_output=True,
                          text=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """History before the base breaks every rule: it is never judged."""
    path = tmp_path / "repo"
    git(tmp_path, "init", "-q", str(path))
    commit(path, "Start.")
    commit(path, "added a subject far longer than seventy-two characters, as main's were. " * 2)
    return path


def test_good_subjects_and_a_merge_pass(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-q", "-c", "side")
    commit(repo, GOOD[0])
    git(repo, "switch", "-q", "main")
    for subject in GOOD[1:]:
        commit(repo, subject)
    git(repo, "merge", "-q", "--no-ff", "--no-edit", "side")
    assert git(repo, "log", "-1", "--format=%s") == "Merge branch 'side'"
    result = check(repo, "--base", base)
    assert result.returncode == 0, result.stderr
    assert f"{len(GOOD) + 1} after {base[:12]}, 0 to reword" in result.stdout


def test_each_broken_rule_is_named_and_only_after_the_base(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    made = {commit(repo, subject): why for subject, why in BAD.items()}
    commit(repo, GOOD[0])
    result = check(repo, "--base", base)
    assert result.returncode == 1
    assert f"{len(BAD) + 1} after {base[:12]}, {len(BAD)} to reword" in result.stdout
    for sha, why in made.items():
        assert f"{sha[:12]} " in result.stderr and why in result.stderr
    assert "Start." not in result.stderr and "seventy-two" not in result.stderr
    assert GOOD[0] not in result.stderr


def test_a_shallow_clone_without_the_base_says_to_fetch_the_history(repo: Path,
                                                                    tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    commit(repo, GOOD[0])
    clone = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(clone))
    result = check(clone, "--base", base)
    assert result.returncode == 2
    assert "not in this shallow clone" in result.stderr
    assert "git fetch --unshallow" in result.stderr
    git(clone, "fetch", "-q", "--unshallow")
    assert check(clone, "--base", base).returncode == 0


def test_a_history_without_the_base_is_refused(repo: Path) -> None:
    result = check(repo, "--base", "6cabb7418ae9d74f7c69923e199c2c4555cfdf73")
    assert result.returncode == 2
    assert "is not in this repository" in result.stderr and "--base SHA" in result.stderr


def test_outside_a_checkout_there_is_nothing_to_check(tmp_path: Path) -> None:
    """An unpacked sdist carries .ci/run but no history."""
    result = check(tmp_path)
    assert result.returncode == 0
    assert "not a git checkout; nothing to check" in result.stdout
