"""The verification cache on a real repository: git notes under refs/notes/retcon-sandbox, written
by plumbing with compare-and-swap, read as untrusted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.verify.cache import REF, Cache, Key, Outcome, Stage
from tests.conftest import git


def git_in(path: Path, *args: str, input_text: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], input=input_text, check=True,
                          capture_output=True, text=True).stdout.strip()

KEY = Key("make", "make test", "docker sha256:abc")
PASS = Outcome((Stage("build", "make", "PASS", True, False, 1.5),
                Stage("test", "make test", "PASS", True, False, 2.0)), None, "", 600)
FAIL = Outcome((Stage("build", "make", "PASS", True, False, 1.0),
                Stage("test", "make test", "FAIL (exit 1)", False, False, 0.5)),
               "Tests FAIL (exit 1) in 0.5s\n$ make test\nassert 1 == 2", "assert 1 == 2", 600)
SLOW = Outcome((Stage("build", "make", "FAIL (timed out after 60s)", False, True, 60.0),),
               "Build FAIL (timed out after 60s)", "", 60)


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Repo, str]:
    repo = Repo.init(tmp_path / "r")
    repo.commit_files("main", {"a.txt": "a\n"}, "one")
    repo.check_out("main")
    return repo, repo.tree_of("main")


def note(path: Path, tree: str) -> list[dict[str, object]]:
    text = git(path, "notes", "--ref", REF, "show", tree)
    return [json.loads(line) for line in text.splitlines()]


def test_a_result_comes_back_only_under_its_whole_key(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    cache = Cache(r)
    assert cache.get(tree, KEY, 600) is None
    cache.put(tree, KEY, PASS)
    got = Cache(r).get(tree, KEY, 600)
    assert got is not None and got.passed and got.cached
    assert got.stages == PASS.stages
    for other in (Key("make all", "make test", KEY.environment),
                  Key("make", None, KEY.environment),
                  Key("make", "make test", "docker sha256:def")):
        assert Cache(r).get(tree, other, 600) is None
    assert Cache(r).get(r.tree_of(r.commit_files("main", {"b": "b"}, "two")), KEY, 600) is None


def test_failures_are_kept_with_their_text_and_the_newest_result_wins(
        repo: tuple[Repo, str]) -> None:
    r, tree = repo
    cache = Cache(r)
    cache.put(tree, KEY, FAIL)
    got = Cache(r).get(tree, KEY, 600)
    assert got is not None and not got.passed
    assert got.failure == FAIL.failure and got.tail == "assert 1 == 2"
    other = Key("make", "pytest", KEY.environment)
    cache.put(tree, other, PASS)
    cache.put(tree, KEY, PASS)  # replaces the failure under the same key, keeps the other
    lines = note(r.root, tree)
    assert len(lines) == 2 and {line["test"] for line in lines} == {"make test", "pytest"}
    assert all(line["passed"] for line in lines)


def test_no_cache_reads_nothing_but_records(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    Cache(r).put(tree, KEY, PASS)
    fresh = Cache(r, read=False)
    assert fresh.get(tree, KEY, 600) is None
    fresh.put(tree, KEY, FAIL)
    got = Cache(r).get(tree, KEY, 600)
    assert got is not None and not got.passed


def test_a_timeout_is_not_reused_by_a_run_that_allows_more_time(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    Cache(r).put(tree, KEY, SLOW)
    assert Cache(r).get(tree, KEY, 60) is not None
    assert Cache(r).get(tree, KEY, 30) is not None
    assert Cache(r).get(tree, KEY, 600) is None


def test_notes_are_plumbing_only_and_git_reads_them(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    (r.root / "a.txt").write_text("edited, not staged\n")
    (r.root / "new.txt").write_text("untracked\n")
    before = (git(r.root, "status", "--porcelain"), (r.root / ".git" / "index").read_bytes(),
              git(r.root, "rev-parse", "HEAD"))
    Cache(r).put(tree, KEY, PASS)
    Cache(r).put(tree, Key(None, "t", "e"), FAIL)
    after = (git(r.root, "status", "--porcelain"), (r.root / ".git" / "index").read_bytes(),
             git(r.root, "rev-parse", "HEAD"))
    assert after == before
    assert [line["build"] for line in note(r.root, tree)] == ["make", None]
    assert git(r.root, "notes", "--ref", REF, "list").split() == [
        git(r.root, "rev-parse", f"{REF}:{tree}"), tree]
    assert git(r.root, "rev-list", "--count", REF) == "2"  # one notes commit per result


def test_two_writers_lose_nothing(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    first, second = Cache(r), Cache(r)
    assert first.get(tree, KEY, 600) is None  # both have read the (empty) notes
    assert second.get(tree, KEY, 600) is None
    other = r.tree_of(r.commit_files("main", {"b": "b"}, "two"))
    first.put(tree, KEY, PASS)
    second.put(other, KEY, FAIL)  # its view is stale: the compare-and-swap fails, it retries
    assert Cache(r).get(tree, KEY, 600) is not None
    assert Cache(r).get(other, KEY, 600) is not None


def test_a_note_at_a_fan_out_path_is_read_and_replaced(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    line = json.dumps({"build": "make", "test": "make test", "environment": KEY.environment,
                       "passed": True, "stages": [], "failure": None, "tail": "",
                       "timeout": 600})
    blob = git_in(r.root, "hash-object", "-w", "--stdin", input_text=line + "\n")
    fanned = git_in(r.root, "mktree", input_text=f"100644 blob {blob}\t{tree[2:]}\n")
    top = git_in(r.root, "mktree", input_text=f"040000 tree {fanned}\t{tree[:2]}\n")
    notes = git(r.root, "commit-tree", top, "-m", "notes by someone else")
    git(r.root, "update-ref", REF, notes)
    assert Cache(r).get(tree, KEY, 600) is not None
    Cache(r).put(tree, KEY, FAIL)
    assert git(r.root, "ls-tree", "-r", "--name-only", REF) == tree  # flat, not twice
    got = Cache(r).get(tree, KEY, 600)
    assert got is not None and not got.passed


@pytest.mark.parametrize("content", [
    "not json at all\n",
    '{"build": "make", "test": "make test", "environment": "docker sha256:abc"}\n',
    json.dumps({"build": "make", "test": "make test", "environment": "docker sha256:abc",
                "passed": True, "failure": "a failure that says it passed", "tail": "",
                "timeout": 600, "stages": []}) + "\n",
    json.dumps({"build": "make", "test": "make test", "environment": "docker sha256:abc",
                "passed": True, "failure": None, "tail": "", "timeout": 600,
                "stages": [{"which": "rm -rf", "command": "x", "verdict": "PASS",
                            "passed": True, "timed_out": False, "seconds": 1}]}) + "\n",
    "[1, 2, 3]\n\x00\udcff garbage",
])
def test_malformed_notes_are_ignored(repo: tuple[Repo, str], content: str) -> None:
    r, tree = repo
    path = r.root.parent / "note"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    git(r.root, "notes", "--ref", REF, "add", "-f", "-F", str(path), tree)
    assert Cache(r).get(tree, KEY, 600) is None
    Cache(r).put(tree, KEY, PASS)  # a write keeps working
    assert Cache(r).get(tree, KEY, 600) is not None


def test_an_oversized_note_is_ignored(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    record = json.dumps({"build": "make", "test": "make test", "environment": KEY.environment,
                         "passed": True, "failure": None, "tail": "x" * 600_000,
                         "timeout": 600, "stages": []})
    path = r.root.parent / "big-note"
    path.write_text(record + "\n")
    git(r.root, "notes", "--ref", REF, "add", "-f", "-F", str(path), tree)
    assert Cache(r).get(tree, KEY, 600) is None


def test_a_ref_that_cannot_be_written_stops_caching_not_the_run(
        repo: tuple[Repo, str]) -> None:
    r, tree = repo
    blocker = r.root / ".git" / "refs" / "notes" / "retcon-sandbox" / "x"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a directory where the ref would be\n")
    cache = Cache(r)
    cache.put(tree, KEY, PASS)
    assert not cache.write
    assert cache.problem and "cannot update refs/notes/retcon-sandbox" in cache.problem
    cache.put(tree, KEY, PASS)  # no further attempt
