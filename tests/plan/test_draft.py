"""The deterministic draft, from facts written by hand (no git, no files)."""

from __future__ import annotations

from retcon_sandbox.plan.draft import conventional, derive, draft, group_files, order_groups
from retcon_sandbox.plan.facts import Change, Facts, MessyCommit


def facts(changes: dict[str, str], commits: list[tuple[str, list[str]]],
          texts: dict[str, str] | None = None, base_texts: dict[str, str] | None = None,
          blobs: dict[str, tuple[str | None, str | None]] | None = None,
          log: tuple[str, ...] = ()) -> Facts:
    blobs = blobs or {}
    return Facts(tuple(Change(p, s, *blobs.get(p, (None, None))) for p, s in changes.items()),
                 tuple(MessyCommit(m, tuple(p)) for m, p in commits),
                 frozenset(p for p, s in changes.items() if s != "D"), texts or {},
                 base_texts or {}, log)


def test_files_changed_together_are_one_group_and_a_sweeping_commit_says_nothing() -> None:
    changes = {f"pkg/m{i}.py": "M" for i in range(8)}
    commits = [("one", ["pkg/m0.py", "pkg/m1.py"]), ("two", ["pkg/m2.py", "pkg/m3.py"]),
               ("reformat everything", list(changes)), ("one again", ["pkg/m0.py", "pkg/m1.py"])]
    groups = group_files(facts(changes, commits))
    assert ["pkg/m0.py", "pkg/m1.py"] in groups
    assert ["pkg/m2.py", "pkg/m3.py"] in groups
    # the files only the sweep touched have no evidence: lone files of one directory, together
    assert ["pkg/m4.py", "pkg/m5.py", "pkg/m6.py", "pkg/m7.py"] in groups


def test_a_test_changed_apart_from_its_code_comes_right_after_it() -> None:
    f = facts({"app/a.py": "A", "app/b.py": "A", "tests/test_a.py": "A"},
              [("tests first", ["tests/test_a.py"]), ("b", ["app/b.py"]), ("a", ["app/a.py"])],
              texts={"tests/test_a.py": "from app.a import thing\n", "app/a.py": "x = 1\n",
                     "app/b.py": "y = 2\n"})
    groups = group_files(f)
    assert groups.index(["tests/test_a.py"]) == groups.index(["app/a.py"]) + 1


def test_a_test_changed_with_code_goes_with_it() -> None:
    f = facts({"app/a.py": "A", "tests/test_a.py": "A", "app/b.py": "A"},
              [("a", ["app/a.py"]), ("b", ["app/b.py"]), ("fix", ["app/a.py", "tests/test_a.py"])],
              texts={"tests/test_a.py": "import app.a\n"})
    assert ["app/a.py", "tests/test_a.py"] in group_files(f)


def test_a_rename_is_one_group_and_comes_with_the_code_that_follows_it() -> None:
    f = facts({"lib/old.py": "D", "lib/new.py": "A", "lib/user.py": "M", "lib/other.py": "A"},
              [("rename", ["lib/old.py", "lib/new.py"]), ("other", ["lib/other.py"]),
               ("use it", ["lib/user.py"])],
              texts={"lib/user.py": "from lib.new import f\n"},
              base_texts={"lib/user.py": "from lib.old import f\n"},
              blobs={"lib/old.py": ("b1", None), "lib/new.py": (None, "b1")})
    groups = group_files(f)
    together = next(g for g in groups if "lib/old.py" in g)
    assert {"lib/old.py", "lib/new.py", "lib/user.py"} <= set(together)


def test_a_deletion_never_comes_before_the_change_that_stops_using_it() -> None:
    f = facts({"core/gone.py": "D", "core/user.py": "M"},
              [("delete", ["core/gone.py"]), ("x", ["core/user.py"]),
               ("y", ["core/user.py", "core/x"])],
              texts={"core/user.py": "import os\n"},
              base_texts={"core/user.py": "from core.gone import helper\n"})
    d = derive(f)
    assert d.stops["core/gone.py"] == {"core/user.py"}
    ordered = order_groups([["core/gone.py"], ["core/user.py"]], [0.0, 1.0], d)
    assert ordered == [["core/user.py"], ["core/gone.py"]]


def test_groups_that_need_each_other_are_merged() -> None:
    f = facts({"a.py": "A", "b.py": "A"}, [("a", ["a.py"]), ("b", ["b.py"])],
              texts={"a.py": "import b\n", "b.py": "import a\n"})
    d = derive(f)
    assert order_groups([["a.py"], ["b.py"]], [0.0, 1.0], d) == [["a.py", "b.py"]]


def test_code_comes_after_the_changed_code_it_imports_whatever_the_messy_order() -> None:
    f = facts({"app/user.py": "A", "app/base.py": "A"},
              [("user first", ["app/user.py"]), ("base later", ["app/base.py"])],
              texts={"app/user.py": "from app.base import B\n"})
    assert group_files(f) == [["app/base.py"], ["app/user.py"]]


def test_a_manifest_joins_the_code_it_changed_with_else_comes_first() -> None:
    f = facts({"pyproject.toml": "M", "src/x.py": "A", "src/y.py": "A", "setup.cfg": "M"},
              [("x", ["src/x.py"]), ("y and deps", ["src/y.py", "pyproject.toml"]),
               ("cfg", ["setup.cfg"])])
    groups = group_files(f)
    assert ["pyproject.toml", "src/y.py"] in groups
    assert groups[0] == ["setup.cfg"]


def test_docs_changed_only_with_one_groups_code_join_it_the_rest_come_last() -> None:
    f = facts({"api/x.py": "A", "api/y.py": "A", "docs/x.md": "A", "README.md": "M"},
              [("x with its docs", ["api/x.py", "docs/x.md"]), ("y", ["api/y.py"]),
               ("readme", ["README.md"])])
    groups = group_files(f)
    assert ["api/x.py", "docs/x.md"] in groups
    assert groups[-1] == ["README.md"]


def test_every_file_is_in_exactly_one_group() -> None:
    changes = {"a/x.py": "A", "a/y.py": "M", "b/z.rs": "D", "tests/test_x.py": "A",
               "docs/d.md": "A", "Cargo.toml": "M", "weird name.txt": "A"}
    commits = [("one", ["a/x.py", "b/z.rs"]), ("two", ["tests/test_x.py", "docs/d.md"]),
               ("three", ["Cargo.toml", "weird name.txt", "a/y.py"])]
    placed = [p for g in group_files(facts(changes, commits)) for p in g]
    assert sorted(placed) == sorted(changes)


def test_messages_come_from_a_describing_messy_commit_never_from_noise() -> None:
    f = facts({"shop/discounts.py": "A"},
              [("WIP discounts", ["shop/discounts.py"]), ("fix build", ["shop/discounts.py"]),
               ("more discount stuff", ["shop/discounts.py"])])
    assert [g.message for g in draft(f)] == ["Add shop/discounts.py"]
    f2 = facts({"shop/discounts.py": "A"},
               [("wip", ["shop/discounts.py"]), ("add discount codes", ["shop/discounts.py"])])
    assert [g.message for g in draft(f2)] == ["Add discount codes"]


def test_conventional_commits_when_the_log_uses_them() -> None:
    log = ("feat: cart", "fix(cart): rounding", "docs: readme", "Merge stuff")
    assert conventional(log)
    assert not conventional(("Add cart", "Fix rounding", "docs: readme"))
    f = facts({"src/a.py": "A", "tests/test_a.py": "A", "README.md": "M"},
              [("a", ["src/a.py"]), ("t", ["tests/test_a.py"]), ("r", ["README.md"])],
              texts={"tests/test_a.py": "from src.a import x\n"}, log=log)
    messages = [g.message for g in draft(f)]
    assert messages == ["feat: add src/a.py", "test: add tests for src/a.py",
                        "docs: update README.md"]


def test_a_large_tangled_branch_is_planned_whole() -> None:
    import random

    rng = random.Random(1)
    files = [f"pkg{i % 20}/mod{i}.py" for i in range(800)] + \
        [f"tests/test_mod{i}.py" for i in range(200)] + [f"docs/d{i}.md" for i in range(50)]
    texts = {f"tests/test_mod{i}.py": f"from pkg{i % 20}.mod{i} import x\n" for i in range(200)}
    texts |= {f"pkg{i % 20}/mod{i}.py": f"from pkg{(i + 1) % 20}.mod{i + 1} import y\n"
              for i in range(0, 800, 3)}
    commits = [(f"commit {c}", rng.sample(files, rng.randint(1, 30))) for c in range(150)]
    f = facts(dict.fromkeys(files, "A"), commits, texts=texts)
    groups = draft(f)
    assert sorted(p for g in groups for p in g.paths) == sorted(files)
    where = {p: i for i, g in enumerate(groups) for p in g.paths}
    d = derive(f)
    assert all(where[q] <= where[p] for p in files for q in d.deps[p])  # each prefix can build


def test_a_merge_subject_is_noise_and_a_conventional_subject_keeps_its_case() -> None:
    f = facts({"app/a.py": "A"}, [("Merge branch 'main' into feature", ["app/a.py"]),
                                  ("Merge pull request #12 from x/y", ["app/a.py"])])
    assert [g.message for g in draft(f)] == ["Add app/a.py"]
    f2 = facts({"app/mul.py": "A"}, [("feat: mul", ["app/mul.py"])])  # the log is not conventional
    assert [g.message for g in draft(f2)] == ["feat: mul"]


def test_empty_files_are_never_taken_for_a_rename() -> None:
    """Two packages, one added and one removed, each with an empty `__init__.py`: not one
    change (git's rename detection never pairs empty files either)."""
    empty = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    f = facts({"reports/__init__.py": "A", "reports/pdf.py": "A", "legacy/__init__.py": "D",
               "legacy/old.py": "D"},
              [("add PDF reports", ["reports/__init__.py", "reports/pdf.py"]),
               ("remove legacy package", ["legacy/__init__.py", "legacy/old.py"])],
              blobs={"reports/__init__.py": (None, empty), "legacy/__init__.py": (empty, None),
                     "reports/pdf.py": (None, "b1"), "legacy/old.py": ("b2", None)})
    groups = group_files(f)
    assert ["reports/__init__.py", "reports/pdf.py"] in groups
    assert ["legacy/__init__.py", "legacy/old.py"] in groups


def test_a_conftest_goes_with_the_first_tests_not_after_them() -> None:
    """The messy branch adds tests/conftest.py first, then code with the tests that use its
    fixture: the draft keeps the fixture with those tests (last, they would fail without it)."""
    f = facts({"tests/conftest.py": "A", "app/stats.py": "A", "tests/test_stats.py": "A"},
              [("fixtures", ["tests/conftest.py"]),
               ("totals", ["app/stats.py", "tests/test_stats.py"])],
              texts={"tests/test_stats.py": "from app.stats import total\n"})
    groups = group_files(f)
    assert [sorted(g) for g in groups] == [["app/stats.py", "tests/conftest.py",
                                           "tests/test_stats.py"]]
