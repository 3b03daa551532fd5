"""Whose the cleaned branch is, from its reflog (`ownership.judge`, pure)."""

from __future__ import annotations

from pathlib import Path

from retcon_sandbox.reconstruct import ownership
from retcon_sandbox.reconstruct.ownership import CREATED, PREFIX, judge, spec_id, tag

A = spec_id(Path("/work/a.toml"))
B = spec_id(Path("/work/b.toml"))
BASE, ONE, TWO = "b" * 40, "1" * 40, "2" * 40


def entry(sha: str, reason: str, spec: ownership.SpecId | None = A) -> tuple[str, str]:
    return sha, PREFIX + (tag(reason, spec) if spec else reason)


def verdict(reflog: list[tuple[str, str]], chain: list[str], recorded: list[str],
            me: ownership.SpecId = A) -> ownership.Refusal | None:
    return judge(reflog, me, "a.toml", "shared-clean", BASE, chain, recorded)


def test_the_spec_whose_run_created_the_branch_goes_on() -> None:
    created = entry(BASE, CREATED)
    assert verdict([created], [], []) is None
    assert verdict([created, entry(ONE, "commit #1")], [ONE], [ONE]) is None
    # your commit on top after a stuck is kept
    assert verdict([created, entry(ONE, "commit #1"), (TWO, "commit: my note")],
                   [ONE, TWO], [ONE]) is None


def test_another_specs_branch_at_the_merge_base_is_refused_naming_it() -> None:
    refusal = verdict([entry(BASE, CREATED)], [], [], me=B)
    assert refusal is not None and refusal.adopt
    assert refusal.why == "a run of another spec, /work/a.toml, created it"


def test_another_specs_commit_on_the_branch_is_named_and_adoption_not_suggested() -> None:
    reflog = [entry(BASE, CREATED), entry(ONE, "commit #1", B)]
    refusal = verdict(reflog, [ONE], [])
    assert refusal is not None and not refusal.adopt
    assert refusal.why == (f"a run of a.toml created it, then a run of another spec, "
                           f"/work/b.toml, put {ONE[:12]} on it (commit #1)")
    assert "--adopt-branch" not in refusal.hint
    assert f"git branch -f shared-clean {BASE[:12]}" in refusal.hint
    # once reset past it, that commit is no longer on the branch: the branch is ours again
    assert verdict([*reflog, (BASE, "reset: moving to " + BASE)], [], []) is None
    # this spec's recorded commits below it: the reset goes to the last of them
    refusal = verdict([entry(BASE, CREATED), entry(ONE, "commit #1"), entry(TWO, "commit #1", B)],
                      [ONE, TWO], [ONE])
    assert refusal is not None and f"git branch -f shared-clean {ONE[:12]}" in refusal.hint


def test_a_branch_made_otherwise_is_said_so() -> None:
    for reflog in ([], [(BASE, "branch: Created from main")]):
        refusal = verdict(reflog, [], [])
        assert refusal is not None and refusal.adopt
        assert refusal.why == "its reflog does not show a run of retcon-sandbox creating it"
    refusal = verdict([entry(ONE, CREATED)], [], [])
    assert refusal is not None
    assert refusal.why == (f"a run of a.toml created it at {ONE[:12]}, not at the merge-base "
                           f"{BASE[:12]} this run works from")


def test_commits_the_spec_does_not_record_are_counted() -> None:
    refusal = verdict([entry(BASE, CREATED), (ONE, "commit: x"), (TWO, "commit: y")],
                      [ONE, TWO], [])
    assert refusal is not None and refusal.adopt
    assert "holds 2 commit(s) past it that the spec's history does not record" in refusal.why


def test_a_branch_an_earlier_version_created_is_taken_as_this_specs() -> None:
    """Before the spec was named in the reflog: the creation alone is trusted, as then."""
    assert verdict([(BASE, PREFIX + CREATED)], [], []) is None


def test_a_path_that_is_not_utf8_or_holds_parentheses_round_trips() -> None:
    odd = spec_id(Path("/work/we(i)rd \udce9/a.toml"))
    move = ownership.parse(ONE, PREFIX + tag("commit #2", odd))
    assert move.spec == odd and move.what == "commit #2"
    assert odd.path == "/work/we(i)rd \\xe9/a.toml"
