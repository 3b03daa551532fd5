"""A note that `git notes merge -s cat_sort_uniq` made of several jobs' notes: their lines,
sorted as text. Read strictly, line by line; the newest result of a key found by its time."""

from __future__ import annotations

import json
from pathlib import Path

from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.userkey import UserKey
from retcon_sandbox.verify.cache import REF, Cache, Key, Outcome, Stage, encode, newest_first, seal

KEY = Key(None, "make test", "env")
OURS = UserKey(b"o" * 32, "ours")


def outcome(passed: bool) -> Outcome:
    verdict = "PASS" if passed else "FAIL (exit 1)"
    return Outcome((Stage("test", "make test", verdict, passed, False, 1.0),),
                   None if passed else "Tests FAIL", "", 600)


def line(tree: str, passed: bool, at: int, key: UserKey = OURS) -> str:
    record = seal(tree, {**encode(KEY, outcome(passed)), "at": at}, key)
    return json.dumps(record, sort_keys=True)


def repo_and_tree(path: Path) -> tuple[Repo, str]:
    repo = Repo.init(path)
    return repo, repo.tree_of(repo.commit_files("main", {"a": "a\n"}, "one"))


def merged(repo: Repo, tree: str, lines: list[str]) -> None:
    """The note `git notes merge -s cat_sort_uniq` leaves: the lines, sorted, no duplicates."""
    blob = repo.write_blob("".join(sorted({f"{x}\n" for x in lines})).encode())
    assert repo.write_note(REF, tree, blob, repo.ref_sha(REF), "merged") is not None


def test_the_newest_record_is_found_by_its_time_not_its_line(tmp_path: Path) -> None:
    repo, tree = repo_and_tree(tmp_path / "r")
    older, newer = line(tree, False, 999_999_999), line(tree, True, 1_000_000_000)
    assert sorted([older, newer]) == [newer, older]  # as text, the older line comes last
    merged(repo, tree, [older, newer])
    got = Cache(repo, key=OURS).get(tree, KEY, 600)
    assert got is not None and got.passed


def test_a_merged_note_with_a_forged_and_a_malformed_line_passes_nothing_forged(
        tmp_path: Path) -> None:
    repo, tree = repo_and_tree(tmp_path / "r")
    forged = line(tree, True, 1_790_000_000, UserKey(b"f" * 32, "forger"))  # the newest
    two_in_one = line(tree, True, 5) + line(tree, True, 6)  # two objects on one line
    merged(repo, tree, [line(tree, False, 1_700_000_000), forged, two_in_one, "not json"])
    for trust in (False, True):
        got = Cache(repo, key=OURS, trust=trust).get(tree, KEY, 600)
        assert got is not None and not got.passed and not got.claimed, trust
    claim = Cache(repo, key=OURS).claim(tree, KEY, 600)
    assert claim is not None and claim.passed and claim.claimed
    only_forged, same_tree = repo_and_tree(tmp_path / "forged only")
    assert same_tree == tree
    merged(only_forged, tree, [forged])
    assert Cache(only_forged, key=OURS).get(tree, KEY, 600) is None
    assert Cache(only_forged, key=OURS, trust=True).get(tree, KEY, 600) is not None


def test_newest_first_keeps_later_lines_first_among_equal_times() -> None:
    records = [{"at": 5, "n": 1}, {"at": 7, "n": 2}, {"at": 5, "n": 3}, {"n": 4},
               {"at": True, "n": 5}]
    assert [r["n"] for r in newest_first(records)] == [2, 3, 1, 5, 4]
