"""When a logical commit may end without a commit of its own (spec/owed.py), decided from the
spec and the paths that still differ: never while a file it names still differs, whoever else
names it, unless the model names a later commit that names each of those files."""

from __future__ import annotations

from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.owed import names, still_owed


def commit(number: int, hints: str = "", paths: tuple[str, ...] | None = None) -> CommitSpec:
    return CommitSpec(number, f"subject {number}\n\nbody", hints, paths, ())


# The real range: #4's hints name number.py, which #5 names too.
COMMITS = (commit(1, "Set up the package."), commit(2, "The README."), commit(3, "i18n"),
           commit(4, "Add intword to src/humanize/number.py, with its tests."),
           commit(5, "Format large numbers in number.py and filesize.py."))
CHANGED = ("src/humanize/number.py", "tests/test_number.py")


def test_a_file_the_commit_names_is_owed_whoever_else_names_it() -> None:
    owed = still_owed(COMMITS[3], COMMITS, CHANGED)
    assert owed is not None and owed.files == ("src/humanize/number.py",)
    assert "src/humanize/number.py" in owed.for_model() and "held_by" in owed.for_model()
    summary = owed.summary()
    assert summary.startswith("commit #4 (subject 4) has no commit: ")
    assert "it named no later commit that holds them" in summary


def test_a_later_commit_that_names_every_owed_file_may_hold_them() -> None:
    assert still_owed(COMMITS[3], COMMITS, CHANGED, held_by=5) is None


def test_a_commit_that_is_not_later_or_does_not_name_the_files_holds_nothing() -> None:
    for held_by in (4, 3, 1, 0, -1, 6):
        owed = still_owed(COMMITS[3], COMMITS, CHANGED, held_by)
        assert owed is not None and "is not a later commit (this is #4 of 5)" in owed.why
    both = ("src/humanize/number.py", "src/humanize/time.py")
    wide = (*COMMITS[:3], commit(4, "number.py and time.py"), COMMITS[4])
    owed = still_owed(wide[3], wide, both, held_by=5)
    assert owed is not None and owed.why == "commit #5 does not name src/humanize/time.py"
    assert owed.files == both  # the commit still owes both
    assert "commit #5 does not name src/humanize/time.py" in owed.summary()


def test_nothing_is_owed_when_no_named_file_differs() -> None:
    assert still_owed(COMMITS[3], COMMITS, ("tests/test_number.py", "README.md")) is None
    assert still_owed(COMMITS[3], COMMITS, ()) is None
    assert still_owed(commit(1), (commit(1),), CHANGED) is None  # no hints: names nothing


def test_paths_and_hints_name_files() -> None:
    by_paths = commit(1, paths=("docs", "*.md"))
    assert names(by_paths, "docs/a/b.txt") and names(by_paths, "x/README.md")
    assert not names(by_paths, "documents/x")
    hinted = commit(2, "Only shop/discounts.py and the README.md section.")
    assert names(hinted, "shop/discounts.py") and names(hinted, "README.md")
    assert not names(hinted, "other/discounts.py")  # a path names that path only
    assert names(commit(3, "Only discounts.py."), "other/discounts.py")  # a file name: any
    assert not names(hinted, "shop/discounts.pyc") and not names(hinted, "shop")


def test_a_long_list_is_cut_short() -> None:
    many = tuple(f"pkg/m{i}.py" for i in range(25))
    hinted = commit(1, " ".join(many))
    owed = still_owed(hinted, (hinted,), many)
    assert owed is not None and len(owed.files) == 25
    assert "pkg/m9.py and 15 more" in owed.summary() and "m10" not in owed.summary()
