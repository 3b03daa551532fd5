"""The verification cache on a real repository: git notes under refs/notes/retcon-sandbox, written
by plumbing with compare-and-swap, read as untrusted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox import userkey
from retcon_sandbox.errors import GitError
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.userkey import UserKey
from retcon_sandbox.verify.cache import REF, Cache, Key, Outcome, Stage, encode, seal
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
    line = json.dumps(seal(tree, encode(KEY, PASS), userkey.load()))
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


# --- who wrote it: the user's key ------------------------------------------------------------

OTHERS = UserKey(b"someone else's key, not the user's", "test")
FORGED = Outcome((Stage("build", "make", "PASS", True, False, 0.1),
                  Stage("test", "make test", "PASS", True, False, 0.1)), None, "", 600)


def put_line(r: Repo, tree: str, *records: dict[str, object]) -> None:
    path = r.root.parent / "forged-note"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    git(r.root, "notes", "--ref", REF, "add", "-f", "-F", str(path), tree)


def test_a_note_this_user_did_not_write_is_a_claim_not_a_result(
        repo: tuple[Repo, str]) -> None:
    r, tree = repo
    Cache(r).put(tree, KEY, FAIL)  # the user's own result: the tests fail
    unsigned = encode(KEY, FORGED)
    for forged in (unsigned, seal(tree, unsigned, OTHERS), {**unsigned, "mac": "0" * 64}):
        put_line(r, tree, forged)  # whoever can push the notes ref claims a pass
        assert Cache(r).get(tree, KEY, 600) is None
        claim = Cache(r).claim(tree, KEY, 600)
        assert claim is not None and claim.passed and claim.claimed
        trusted = Cache(r, trust=True).get(tree, KEY, 600)  # --trust-notes
        assert trusted is not None and trusted.passed and trusted.claimed
    Cache(r).put(tree, KEY, FAIL)  # our own line replaces the claim under the same key
    got = Cache(r).get(tree, KEY, 600)
    assert got is not None and not got.passed and not got.claimed
    assert Cache(r).claim(tree, KEY, 600) is None


def test_the_mac_covers_the_tree_and_every_field(repo: tuple[Repo, str]) -> None:
    r, tree = repo
    other = r.tree_of(r.commit_files("main", {"b": "b"}, "two"))
    Cache(r).put(other, KEY, PASS)
    ours = note(r.root, other)[0]
    put_line(r, tree, ours)  # a genuine line, moved to another tree
    assert Cache(r).get(tree, KEY, 600) is None
    Cache(r).put(tree, KEY, FAIL)
    failing = note(r.root, tree)[0]
    stages = json.loads(json.dumps(failing["stages"]))
    stages[1].update(verdict="PASS", passed=True)
    edits: list[dict[str, object]] = [
        {"passed": True, "failure": None, "stages": stages},  # the verdict flipped
        {"environment": "docker sha256:def"}, {"by": "retcon-sandbox 9.9"},
        {"timeout": 6000}, {"tail": "all good"}]
    for edit in edits:
        put_line(r, tree, {**failing, **edit})
        got = Cache(r).get(tree, Key(KEY.build, KEY.test, str(edit.get("environment",
                                                                        KEY.environment))),
                           600)
        assert got is None, edit


def sealed_variant(tree: str, **changes: object) -> dict[str, object]:
    record = {**encode(KEY, PASS), **changes}
    return seal(tree, {k: v for k, v in record.items() if v != "DROP"}, userkey.load())


def stage(**changes: object) -> list[dict[str, object]]:
    return [{"which": "build", "command": "make", "verdict": "PASS", "passed": True,
             "timed_out": False, "seconds": 1.0},
            {"which": "test", "command": "make test", "verdict": "PASS", "passed": True,
             "timed_out": False, "seconds": 1.0, **changes}]


@pytest.mark.parametrize("changes", [
    {"v": 1}, {"v": "DROP"}, {"extra": "field"}, {"by": "someone"}, {"at": "today"},
    {"stages": stage(verdict="pass")}, {"stages": stage(verdict="PASS ")},
    {"stages": stage(verdict="ok")},
    {"stages": stage(verdict="FAIL (exit 0)", passed=False)},
    {"stages": stage(verdict="FAIL (exit 1)")},  # a failing verdict said to pass
    {"stages": stage(command="true")},  # a command the key does not name
    {"stages": stage(which="build")}, {"stages": stage(seconds=-1)},
    {"stages": stage(extra=1)}, {"stages": stage()[:1]},  # a pass that skipped the tests
    {"stages": []}, {"timeout": 0}, {"passed": False},
    # verdicts no run gives: an exit status over 255, a signal over 64, a timeout that did not
    # last as long as it says, a timeout of a million seconds; made before 1970, or in 2096
    *({"stages": stage(verdict=v, passed=False, timed_out="timed" in v), "passed": False,
       "failure": "x"} for v in ("FAIL (exit 999)", "FAIL (exit 256)",
                                 "FAIL (killed by signal 99)",
                                 "FAIL (timed out after 9999s)")),
    {"timeout": 1e6}, {"timeout": 1e300}, {"stages": stage(seconds=5000.0)},
    {"at": -5}, {"at": 4_000_000_000},
])
def test_only_lines_in_the_exact_form_we_write_are_read(repo: tuple[Repo, str],
                                                         changes: dict[str, object]) -> None:
    r, tree = repo
    put_line(r, tree, sealed_variant(tree))  # the form we write, sealed: read
    assert Cache(r).get(tree, KEY, 600) is not None
    put_line(r, tree, sealed_variant(tree, **changes))  # sealed with our key, but not our form
    assert Cache(r, trust=True).get(tree, KEY, 600) is None
    assert Cache(r).claim(tree, KEY, 600) is None


@pytest.mark.parametrize("target", ["blob", "commit", "tree"])
def test_a_corrupted_notes_ref_says_how_to_clear_it(repo: tuple[Repo, str], target: str) -> None:
    r, tree = repo
    Cache(r).put(tree, KEY, PASS)
    sha = {"blob": git(r.root, "rev-parse", "main:a.txt"), "commit": git(r.root, "rev-parse",
           "main"), "tree": tree}[target]
    git(r.root, "update-ref", REF, sha)
    with pytest.raises(GitError) as caught:
        Cache(r).check()
    assert REF in caught.value.message
    assert f"git update-ref -d {REF}" in (caught.value.hint or "")
    git(r.root, "update-ref", "-d", REF)
    Cache(r).check()
    Cache(r).put(tree, KEY, PASS)
    assert Cache(r).get(tree, KEY, 600) is not None
