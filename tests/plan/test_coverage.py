"""Coverage of a spec's paths, and the repair of a model's proposal."""

from __future__ import annotations

from retcon_sandbox.plan.coverage import Proposed, check, repair
from retcon_sandbox.plan.draft import Group
from retcon_sandbox.plan.facts import Change, Facts, MessyCommit
from retcon_sandbox.plan.order import derive

PATHS = ["src/a.py", "src/b.py", "docs/x.md", "README.md"]


def test_full_coverage() -> None:
    c = check(PATHS, [(1, ("src",)), (2, ("*.md",))])
    assert c.complete and not c.uncovered and not c.twice


def test_uncovered_and_twice_and_patterns_that_match_nothing() -> None:
    c = check(PATHS, [(1, ("src/a.py", "README.md")), (2, ("*.md", "lib/**"))])
    assert c.uncovered == ("src/b.py",)
    assert c.twice == {"README.md": (1, 2)}
    assert c.unmatched == {2: ("lib/**",)}
    assert not c.complete


def test_files_left_to_hints_only_commits_are_the_models() -> None:
    c = check(PATHS, [(1, ("src",)), (2, None)])
    assert c.by_model == (2,)
    assert c.uncovered == ("docs/x.md", "README.md")
    assert c.complete
    assert not check(PATHS, [(1, ("src", "docs")), (2, None), (3, ("src/a.py",))]).complete


def _facts() -> Facts:
    changes = {"lib/base.py": "A", "lib/user.py": "A", "tests/test_user.py": "A",
               "README.md": "M"}
    return Facts(tuple(Change(p, s) for p, s in changes.items()),
                 (MessyCommit("all", tuple(changes)),), frozenset(changes),
                 {"lib/user.py": "from lib.base import B\n",
                  "tests/test_user.py": "from lib.user import U\n"})


DRAFT = [Group(("lib/base.py", "lib/user.py"), "Add lib", "h", "code"),
         Group(("tests/test_user.py",), "Test lib", "h", "test"),
         Group(("README.md",), "Docs", "h", "docs")]


def test_a_missed_file_goes_back_to_its_draft_group_a_repeat_keeps_the_first() -> None:
    proposal = [Proposed("feat: base", ("lib/base.py", "lib/nope.py")),
                Proposed("feat: user", ("lib/user.py", "lib/base.py", "tests/test_user.py"))]
    groups, repairs = repair(proposal, DRAFT, derive(_facts()))
    assert [g.paths for g in groups] == [("lib/base.py",),
                                         ("lib/user.py", "tests/test_user.py"),
                                         ("README.md",)]
    assert [g.message for g in groups] == ["feat: base", "feat: user", "Docs"]
    assert repairs.repeated == {"lib/base.py": 1}
    assert repairs.unknown == ["lib/nope.py"]
    assert repairs.missed == {"README.md": 3}
    placed = [p for g in groups for p in g.paths]
    assert sorted(placed) == sorted(_facts().paths)


def test_a_missed_file_joins_the_proposed_commit_holding_most_of_its_draft_group() -> None:
    proposal = [Proposed("one", ("lib/base.py", "tests/test_user.py", "README.md"))]
    groups, repairs = repair(proposal, DRAFT, derive(_facts()))
    assert repairs.missed == {"lib/user.py": 1}
    assert len(groups) == 1 and set(groups[0].paths) == set(_facts().paths)


def test_the_order_is_fixed_so_each_prefix_can_build() -> None:
    proposal = [Proposed("test first", ("tests/test_user.py",)),
                Proposed("code", ("lib/base.py", "lib/user.py", "README.md"))]
    groups, _ = repair(proposal, DRAFT, derive(_facts()))
    assert [g.message for g in groups] == ["code", "test first"]


def test_a_proposal_that_places_too_little_is_refused() -> None:
    groups, repairs = repair([Proposed("tiny", ("README.md",))], DRAFT, derive(_facts()))
    assert repairs.refused and groups == DRAFT
    groups, repairs = repair([], DRAFT, derive(_facts()))
    assert repairs.refused == "the model proposed no commit" and groups == DRAFT


def test_the_models_words_reach_the_spec_with_controls_escaped() -> None:
    proposal = [Proposed("feat: x\x1b]52;c;aGk=\x07\n\nbody\u202e", tuple(_facts().paths),
                         "hint\x00")]
    groups, _ = repair(proposal, DRAFT, derive(_facts()))
    assert "\x1b" not in groups[0].message and "\x07" not in groups[0].message
    assert groups[0].message.startswith("feat: x\\e]52") and "\n\nbody" in groups[0].message
    assert "\x00" not in groups[0].hints
