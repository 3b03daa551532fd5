"""`verify --shard K/N` across clones, as the jobs of a CI matrix run it: each job verifies its
share and pushes its notes to a ref of its own; the notes merge with `git notes merge -s
cat_sort_uniq` (docs/scaling.md), and `verify` afterwards finds every tree cached. Real git,
the real CLI, the local backend."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.verify.cache import REF
from tests.conftest import cli, cli_on_a_terminal, git

pytestmark = pytest.mark.slow  # whole runs of the command line

LOCAL = ("--sandbox", "local")
KEY = {"RETCON_SANDBOX_NOTES_KEY": "a-ci-secret-shared-by-every-job-of-the-matrix-0123"}
COMMANDS = ("--build", "true", "--test", "test ! -f broken")
RANGE = "origin/main..origin/feature"


def origin_with_feature(path: Path) -> list[str]:
    """main, then feature: 7 commits with distinct trees; the 4th adds `broken` (its test fails)
    and the 5th removes it again. The trees of the range, in order."""
    path.mkdir()
    git(path, "init", "-q")
    (path / "a").write_text("0\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    git(path, "checkout", "-qb", "feature")
    for i in range(1, 8):
        if i == 4:
            (path / "broken").write_text("x\n")
        elif i == 5:
            (path / "broken").unlink()
        (path / "a").write_text(f"{i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-qm", f"c{i}")
    return git(path, "log", "--reverse", "--format=%T", "main..feature").splitlines()


def clone(origin: Path, path: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(origin), str(path)], check=True)
    return path


def events(out: str, name: str) -> list[dict[str, object]]:
    """The events named `name`, in range order (commits finish in any order)."""
    found = [e for e in map(json.loads, out.splitlines()) if e["event"] == name]
    return sorted(found, key=lambda e: int(e.get("number", 0)))


def job(origin: Path, path: Path, shard: str, *extra: str) -> list[dict[str, object]]:
    """One matrix job: a fresh clone, its share verified, its notes pushed to its own ref."""
    clone(origin, path)
    result = cli("verify", RANGE, "--repo", str(path), *COMMANDS, *LOCAL, "--shard", shard,
                 "--json", *extra, env=KEY)
    assert result.code in (0, 3), result.out + result.err
    (start,) = events(result.out, "verify_start")
    assert isinstance(start["shard"], dict)
    k = shard.split("/")[0]
    git(path, "push", "-q", "origin", f"{REF}:{REF}-shard-{k}")
    return events(result.out, "commit_verified")


def test_two_shards_in_two_clones_merge_their_notes_and_cover_every_tree(tmp_path: Path
                                                                         ) -> None:
    origin = tmp_path / "origin"
    trees = origin_with_feature(origin)
    first = job(origin, tmp_path / "job1", "1/2")
    second = job(origin, tmp_path / "job2", "2/2")
    assert [e["tree"] for e in first] == trees[0::2] and [e["tree"] for e in second] == \
        trees[1::2]
    assert not any(e["cached"] for e in first + second)
    # the second job also verified the first commit on its own (an overlap: the same tree has
    # a note in both refs, so the merge must combine two notes of one object)
    overlap = cli("verify", "origin/feature~6", "--repo", str(tmp_path / "job2"),
                  *COMMANDS, *LOCAL, "--no-cache", env=KEY)
    assert overlap.code == 0, overlap.out + overlap.err
    git(tmp_path / "job2", "push", "-q", "-f", "origin", f"{REF}:{REF}-shard-2")

    merger = clone(origin, tmp_path / "merge")
    git(merger, "fetch", "-q", "origin", f"+{REF}-shard-*:{REF}-shard-*")
    git(merger, "notes", "--ref", REF, "merge", "-s", "cat_sort_uniq", f"{REF}-shard-1")
    manual = subprocess.run(["git", "-C", str(merger), "notes", "--ref", REF, "merge",
                             f"{REF}-shard-2"], capture_output=True, text=True)
    assert manual.returncode != 0 and "CONFLICT" in manual.stdout + manual.stderr
    git(merger, "notes", "merge", "--abort")
    git(merger, "notes", "--ref", REF, "merge", "-s", "cat_sort_uniq", f"{REF}-shard-2")
    assert len(git(merger, "notes", "--ref", REF, "show", trees[0]).splitlines()) == 2

    after = cli("verify", RANGE, "--repo", str(merger), *COMMANDS, *LOCAL, "--json", env=KEY)
    assert after.code == 3, after.out + after.err  # the 4th commit fails, from the cache
    verified = events(after.out, "commit_verified")
    assert [e["tree"] for e in verified] == trees
    assert all(e["cached"] for e in verified)
    assert [e["passed"] for e in verified] == [True, True, True, False, True, True, True]


def test_a_forged_record_in_a_merged_note_passes_nothing(tmp_path: Path) -> None:
    """Whoever can push a ref can add a line to a merged note: a pass claimed for the failing
    tree, newest of all. The user's own failure still stands, even under --trust-notes."""
    origin = tmp_path / "origin"
    trees = origin_with_feature(origin)
    job(origin, tmp_path / "job1", "1/1")
    broken = trees[3]
    forger = clone(origin, tmp_path / "forger")
    git(forger, "fetch", "-q", "origin", f"{REF}-shard-1:{REF}")
    record = json.loads(git(forger, "notes", "--ref", REF, "show", broken))
    assert record["passed"] is False
    record.update(passed=True, failure=None, tail="", at=record["at"] + 10**6,
                  stages=[{**s, "verdict": "PASS", "passed": True} for s in record["stages"]])
    git(forger, "update-ref", "-d", REF)
    git(forger, "notes", "--ref", REF, "add", "-m", json.dumps(record, sort_keys=True), broken)
    git(forger, "push", "-q", "origin", f"{REF}:{REF}-shard-9")

    merger = clone(origin, tmp_path / "merge")
    git(merger, "fetch", "-q", "origin", f"+{REF}-shard-*:{REF}-shard-*")
    for k in (1, 9):
        git(merger, "notes", "--ref", REF, "merge", "-s", "cat_sort_uniq", f"{REF}-shard-{k}")
    lines = git(merger, "notes", "--ref", REF, "show", broken).splitlines()
    assert len(lines) == 2 and sum(json.loads(line)["passed"] for line in lines) == 1
    for extra in ((), ("--trust-notes",)):
        after = cli("verify", RANGE, "--repo", str(merger), *COMMANDS, *LOCAL, "--json",
                    *extra, env=KEY)
        assert after.code == 3, after.out + after.err
        (row,) = [e for e in events(after.out, "commit_verified") if e["tree"] == broken]
        assert row["passed"] is False and row["cached"] is True, extra


def test_a_shard_that_is_not_k_of_n_is_a_usage_error(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    origin_with_feature(origin)
    for bad, why in (("0/2", "K must be from 1 to N"), ("3/2", "K must be from 1 to N"),
                     ("2", "expected K/N"), ("1/0", "K must be from 1 to N")):
        result = cli("verify", "main..feature", "--repo", str(origin), *COMMANDS, *LOCAL,
                     "--shard", bad)
        assert result.code == 2, (bad, result.out + result.err)
        assert why in result.err and "--shard" in result.err, result.err
        assert git(origin, "for-each-ref", "refs/notes") == ""  # nothing ran, nothing written


def test_the_shard_line_is_printed(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    origin_with_feature(origin)
    result = cli("verify", "main..feature", "--repo", str(origin), *COMMANDS, *LOCAL,
                 "--shard", "2/3", env=KEY)
    assert result.code == 0, result.out + result.err  # trees 2 and 5 of 7: both pass
    assert "Shard 2/3: 2 of 7 trees" in result.out
    assert "Shard 2/3: 2 of 7 trees; 2 commits: 2 passed" in result.out


def test_an_empty_shard_on_a_terminal_moves_no_cursor(tmp_path: Path) -> None:
    """N above the number of trees: nothing to do, exit 0, and no table to redraw."""
    origin = tmp_path / "origin"
    origin_with_feature(origin)
    result = cli_on_a_terminal("verify", "main..feature", "--repo", str(origin), *COMMANDS,
                               *LOCAL, "--shard", "9/9",
                               env={**KEY, "TERM": "xterm", "NO_COLOR": ""})
    assert result.code == 0
    text = result.out
    assert "Shard 9/9: 0 of 7 trees" in text and "\x1b[" not in text, text
