"""`paths` patterns: files, directories and git-style globs; a pattern that matches nothing still
to reconstruct is named before the run starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.repo.gitrepo import Repo
from tests.conftest import cli, make_demo

FILES = [
    "README.md", "CHANGES.md", "setup.py", "docs/index.md", "docs/api/cart.md",
    "docs/img/logo.png", "mydocs/x.md", "src/app.py", "src/test_app.py", "src/shop/cart.py",
    "src/shop/test_cart.py", "src/shop/deep/er/test_deep.py", "src/shop/atest_x.py",
    "lib/src/test_lib.py", "tests/test_a.py", "a.mdx", "b/c.md", "src/shop/cart.pyc",
    "data/v1.csv", "data/v2.csv", "data/va.csv",
]


@pytest.mark.parametrize(("pattern", "expected"), [
    ("README.md", ["README.md"]),  # a file: only that path
    ("docs", ["docs/api/cart.md", "docs/img/logo.png", "docs/index.md"]),  # a directory
    ("docs/**", ["docs/api/cart.md", "docs/img/logo.png", "docs/index.md"]),
    ("*.md", ["CHANGES.md", "README.md", "b/c.md", "docs/api/cart.md", "docs/index.md",
              "mydocs/x.md"]),  # no slash: at any depth, as in .gitignore
    ("docs/*.md", ["docs/index.md"]),  # `*` stays within a directory
    ("src/**/test_*.py", ["src/shop/deep/er/test_deep.py", "src/shop/test_cart.py",
                          "src/test_app.py"]),
    ("**/test_*.py", ["lib/src/test_lib.py", "src/shop/deep/er/test_deep.py",
                      "src/shop/test_cart.py", "src/test_app.py", "tests/test_a.py"]),
    ("data/v?.csv", ["data/v1.csv", "data/v2.csv", "data/va.csv"]),
    ("data/v[0-9].csv", ["data/v1.csv", "data/v2.csv"]),
    ("data/v[!0-9].csv", ["data/va.csv"]),
    ("src/shop/cart.py", ["src/shop/cart.py"]),  # not cart.pyc
    ("src/*", ["src/app.py", "src/shop/atest_x.py", "src/shop/cart.py", "src/shop/cart.pyc",
               "src/shop/deep/er/test_deep.py", "src/shop/test_cart.py", "src/test_app.py"]),
])
def test_patterns_match_like_git(pattern: str, expected: list[str]) -> None:
    assert sorted(p for p in FILES if Patterns((pattern,)).matches(p)) == expected


def files_repo(directory: Path) -> Path:
    repo = Repo.init(directory)
    repo.commit_files("main", dict.fromkeys(FILES, "x\n"), "files")
    repo.check_out("main")
    return directory


def git_ls(repo: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", *args], check=True,
                         capture_output=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p)


@pytest.mark.parametrize("pattern", ["docs/**", "docs/*.md", "src/**/test_*.py",
                                     "**/test_*.py", "data/v[0-9].csv", "src/*", "*.md",
                                     "*/c.md", "src/**", "test_*.py", "data/v[!0-9].csv"])
def test_globs_follow_gitignore_rules(tmp_path: Path, pattern: str) -> None:
    """git is the reference: a glob selects what it would ignore in a .gitignore at the root
    (no slash: at any depth; a directory it matches: everything below it)."""
    repo = files_repo(tmp_path / "repo")
    ours = sorted(p for p in FILES if Patterns((pattern,)).matches(p))
    assert ours == git_ls(repo, "--cached", "--ignored", f"--exclude={pattern}")


@pytest.mark.parametrize("path", ["docs", "src/shop", "README.md", "src/shop/cart.py", "data"])
def test_plain_paths_are_files_or_directories_from_the_root(tmp_path: Path, path: str) -> None:
    """git is the reference: `git ls-files -- PATH`."""
    repo = files_repo(tmp_path / "repo")
    ours = sorted(p for p in FILES if Patterns((path,)).matches(p))
    assert ours == git_ls(repo, "--", path)


def test_unmatched_names_the_patterns_that_match_nothing() -> None:
    patterns = Patterns(("docs/**", "*.rst", "src/app.py", "nope"))
    assert patterns.unmatched(FILES) == ["*.rst", "nope"]
    assert Patterns(("*.md",)).unmatched([]) == ["*.md"]


def test_names_with_odd_characters_match_literally() -> None:
    assert Patterns(("a+b (1).txt",)).matches("a+b (1).txt")
    assert not Patterns(("a.txt",)).matches("abtxt")
    assert Patterns(("dir/*",)).matches("dir/line\nbreak")


PATTERN_SPEC = {
    1: '["shop/validation.py", "shop/cart.py", "**/test_validation.py", "shop/legacy_*.py"]',
    2: '["shop/disc*.py"]',
    3: '["tests/**/test_*.py"]',
    4: '["*.md", "docs/**"]',
}


def spec_with(paths: dict[int, str]) -> str:
    text = demo_project.spec_text(True)
    for number, (_, _, original) in enumerate(demo_project.COMMITS, 1):
        written = "paths = [" + ", ".join(f'"{p}"' for p in original) + "]"
        text = text.replace(written, f"paths = {paths[number]}")
    return text


@pytest.mark.slow
def test_a_reconstruction_with_patterns(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=spec_with(PATTERN_SPEC))
    result = cli("execute", str(demo.spec), "--sandbox", "local", "--non-interactive")
    assert result.code == 0, result.out + result.err
    subjects = demo.git("log", "--reverse", "--format=%s", "main..feature-clean").splitlines()
    assert subjects == [c[0].splitlines()[0] for c in demo_project.COMMITS]  # nothing left over
    assert "Taking paths from source: README.md, docs/discounts.md" in result.out
    assert demo.git("diff", "--name-only", "feature-clean~1", "feature-clean").splitlines() == \
        ["README.md", "docs/discounts.md"]
    assert demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


def test_a_pattern_matching_nothing_is_named_before_the_run(tmp_path: Path) -> None:
    paths = {**PATTERN_SPEC, 4: '["*.md", "doc/**", "*.rst"]'}
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=spec_with(paths))
    before = demo.spec.read_bytes()
    result = cli("execute", str(demo.spec), "--sandbox", "local", "--non-interactive")
    assert result.code == 1, result.out + result.err
    assert "[[commit]] #4 → paths: 'doc/**', '*.rst' match(es) no path that differs between " \
        "feature-clean and feature" in result.err
    assert "git diff --name-only main...feature" in result.err
    assert demo.spec.read_bytes() == before
    assert "feature-clean" not in demo.git("branch", "--list")
    assert "Commit 1/4" not in result.out


def test_a_pattern_matching_nothing_on_an_existing_cleaned_branch_names_the_two_trees(
        tmp_path: Path) -> None:
    """The paths an existing cleaned branch carries no longer differ: the hint lists what does
    (the branch's tip against the source, not the merge-base's diff) and says why."""
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=spec_with(PATTERN_SPEC))
    demo.git("branch", "feature-clean", "feature")  # as if an earlier run had carried it all
    result = cli("execute", str(demo.spec), "--sandbox", "local", "--non-interactive",
                 "--adopt-branch")
    assert result.code == 1, result.out + result.err
    assert "git diff --name-only feature-clean feature" in result.err
    assert "main...feature" not in result.err
    assert "The cleaned branch already exists" in result.err
