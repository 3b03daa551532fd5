"""Names from the repository are carried exactly (newlines, tabs, bytes that are not UTF-8,
symlinks, deep paths), no name can add index entries, and no `.git` look-alike is committed.

The repositories are built with git plumbing (`hash-object`, `mktree`, `commit-tree`), which
takes any name, as a hostile repository would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli, llm_env
from tests.fake_openai import FakeOpenAI, Step, call

LOCAL = ("--sandbox", "local", "--non-interactive")
SPEC = """\
source = "feature"
remote = "main"
cleaned = "feature-clean"

[sandbox]
build = "true"
test = "true"

[[commit]]
message = "First"
paths = {first}

[[commit]]
message = "Everything else"
paths = ["*"]
"""


def run_git(repo: Path, *args: str | bytes, stdin: bytes = b"") -> bytes:
    env = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, check=True,
                          capture_output=True, env=env).stdout.strip()


def blob(repo: Path, data: bytes) -> bytes:
    return run_git(repo, "hash-object", "-w", "--stdin", stdin=data)


def tree(repo: Path, entries: dict[bytes, tuple[str, bytes]]) -> bytes:
    """A tree of `path -> (mode, content)`, nested directories included; names are bytes."""
    top: dict[bytes, tuple[str, bytes]] = {}
    subdirs: dict[bytes, dict[bytes, tuple[str, bytes]]] = {}
    for path, (mode, content) in entries.items():
        head, sep, rest = path.partition(b"/")
        if sep:
            subdirs.setdefault(head, {})[rest] = (mode, content)
        else:
            top[head] = (mode, content)
    records = [f"{mode} blob ".encode() + blob(repo, content) + b"\t" + name
               for name, (mode, content) in top.items()]
    records += [b"040000 tree " + tree(repo, sub) + b"\t" + name
                for name, sub in subdirs.items()]
    return run_git(repo, "mktree", "-z", stdin=b"".join(r + b"\0" for r in records))


def make_repo(tmp_path: Path, base: dict[bytes, tuple[str, bytes]],
              feature: dict[bytes, tuple[str, bytes]], first: str) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    root = run_git(repo, "commit-tree", tree(repo, base), "-m", "base")
    tip = run_git(repo, "commit-tree", tree(repo, feature), "-p", root, "-m", "messy")
    run_git(repo, "update-ref", "refs/heads/main", root)
    run_git(repo, "update-ref", "refs/heads/feature", tip)
    (repo / "spec.toml").write_text(SPEC.format(first=first))
    return repo


def listing(repo: Path, rev: str) -> bytes:
    return run_git(repo, "ls-tree", "-r", "-z", "--full-tree", rev)


FILE = "100644"
ODD = {
    b"new\nline.txt": (FILE, b"newline\n"),
    b"tab\there.txt": (FILE, b"tab\n"),
    b"latin1-\xe9.txt": (FILE, b"not utf-8\n"),
    b"dir\n100755 " + b"e69de29bb2d1d6e3\tinjected": (FILE, b"a try at an index entry\n"),
    b"plain.txt": (FILE, b"plain\n"),
}


@pytest.mark.slow
def test_odd_names_reconstruct_exactly(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")}, {b"README": (FILE, b"r\n"), **ODD},
                     first='["plain.txt", "new*"]')
    result = cli("execute", str(repo / "spec.toml"), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert listing(repo, "feature-clean") == listing(repo, "feature")
    first = listing(repo, "feature-clean~1")
    assert b"new\nline.txt" in first and b"plain.txt" in first and b"tab" not in first
    assert b"injected" not in run_git(repo, "ls-tree", "-r", "--name-only", "feature-clean~1")
    assert "Taking paths from source: new\\nline.txt, plain.txt\n" in result.out


@pytest.mark.slow
def test_odd_names_in_json_events_are_valid_json(tmp_path: Path) -> None:
    """A newline is JSON's `\\n`; a byte that is not UTF-8 is `\\xNN` in the string (a lone
    surrogate, which strict parsers refuse, never)."""
    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")}, {b"README": (FILE, b"r\n"), **ODD},
                     first='["latin1-*", "new*"]')
    result = cli("execute", str(repo / "spec.toml"), *LOCAL, "--json")
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    taken = next(e for e in events if e["event"] == "taking_paths")["paths"]
    assert sorted(taken) == ["latin1-\\xe9.txt", "new\nline.txt"]
    assert "\\ud" not in result.out
    assert listing(repo, "feature-clean") == listing(repo, "feature")


@pytest.mark.slow
def test_a_name_that_is_not_utf8_goes_to_the_model_and_back(tmp_path: Path) -> None:
    """The model sees such a name with `\\xNN` (git's `\\NNN` in diffs) and its tools take
    either spelling back to the exact bytes."""
    base = {b"README": (FILE, b"r\n"), b"latin1-\xe9.txt": (FILE, b"old\n")}
    repo = make_repo(tmp_path, base, {**base, b"latin1-\xe9.txt": (FILE, b"new\n"),
                                      b"plain.txt": (FILE, b"plain\n")}, first='["x"]')
    spec = repo / "spec.toml"
    spec.write_text(spec.read_text().replace('paths = ["x"]', 'hints = "the latin1 file"'))
    script: list[Step] = [[call("list_files")], [call("read_file", path="latin1-\\351.txt")],
              [call("write_file", path="latin1-\\xe9.txt", content="new\n")],
              [call("create_commit", message="latin1")]]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert model.tool_results()[0] == "README\nlatin1-\\xe9.txt"
    assert model.tool_results()[1].endswith("old\n")
    first = listing(repo, "feature-clean~1")
    assert b"latin1-\xe9.txt" in first and b"plain.txt" not in first
    assert listing(repo, "feature-clean") == listing(repo, "feature")


@pytest.mark.slow
def test_symlinks_changed_and_deleted_by_paths_commits(tmp_path: Path) -> None:
    base = {b"link": ("120000", b"target-a"), b"gone": ("120000", b"target-b"),
            b"target-a": (FILE, b"a\n")}
    feature = {b"link": ("120000", b"elsewhere"), b"target-a": (FILE, b"a\n"),
               b"elsewhere": (FILE, b"e\n")}
    repo = make_repo(tmp_path, base, feature, first='["link", "gone"]')
    result = cli("execute", str(repo / "spec.toml"), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert listing(repo, "feature-clean") == listing(repo, "feature")
    assert run_git(repo, "cat-file", "-p", "feature-clean~1:link") == b"elsewhere"


@pytest.mark.slow
def test_a_path_a_thousand_directories_deep(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")},
                     {b"README": (FILE, b"r\n"), b"other.txt": (FILE, b"o\n")}, first='["d"]')
    sub = tree(repo, {b"leaf.txt": (FILE, b"deep\n")})
    for _ in range(1000):
        sub = run_git(repo, "mktree", stdin=b"040000 tree " + sub + b"\td\n")
    top = run_git(repo, "ls-tree", "feature") + b"\n040000 tree " + sub + b"\td\n"
    tip = run_git(repo, "commit-tree", run_git(repo, "mktree", stdin=top), "-p", "main",
                  "-m", "deep")
    run_git(repo, "update-ref", "refs/heads/feature", tip)
    result = cli("execute", str(repo / "spec.toml"), *LOCAL)
    assert "Traceback" not in result.out + result.err, result.out + result.err
    assert result.code == 0, result.out + result.err
    assert listing(repo, "feature-clean") == listing(repo, "feature")


@pytest.mark.parametrize("name", [
    b".GIT/config", b".git\xe2\x80\x8c/config", b".git\xef\xbb\xbf/hooks/x", b"GIT~1/config",
    b".git./config", b".git /config", b"sub/.Git/hooks/post-checkout",
])
def test_a_git_look_alike_in_the_source_is_named_and_never_committed(tmp_path: Path,
                                                                     name: bytes) -> None:
    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")},
                     {b"README": (FILE, b"r\n"), name: (FILE, b"[core]\n"),
                      b"ok.txt": (FILE, b"ok\n")}, first='["ok.txt"]')
    result = cli("execute", str(repo / "spec.toml"), *LOCAL)
    assert "Traceback" not in result.out + result.err, result.out + result.err
    assert result.code == 1, result.out + result.err
    assert "is a name git treats as .git" in result.err
    assert "Remove or rename it on the source branch" in result.err
    assert run_git(repo, "for-each-ref", "refs/heads/feature-clean") == b""
    assert "commit_created" not in (repo / "spec.toml").read_text()


def test_a_name_that_is_git_itself_cannot_be_built_either(tmp_path: Path) -> None:
    """The host's tree writer refuses a look-alike even if one reached it another way."""
    from retcon_sandbox.errors import GitError
    from retcon_sandbox.repo.gitrepo import FileChange, Repo, TreeEntry

    repo = make_repo(tmp_path, {b"README": (FILE, b"r\n")}, {b"README": (FILE, b"r\n")},
                     first='["README"]')
    git_repo = Repo(repo)
    blob_sha = git_repo.write_blob(b"x")
    with pytest.raises(GitError, match=r"treats as \.git"):
        git_repo.make_tree(git_repo.tree_of("main"),
                           [FileChange(".Git\u200d/hooks/pre-commit", TreeEntry("100755",
                                                                                 blob_sha))])
