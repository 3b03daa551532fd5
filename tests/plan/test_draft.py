"""The deterministic draft, from facts written by hand (no git, no files)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from retcon_sandbox.plan import weights
from retcon_sandbox.plan.cluster import link
from retcon_sandbox.plan.draft import (
    EVIDENCE_LIMIT,
    Grouping,
    Scores,
    draft,
    group_files,
    ordered_history,
    with_their_tests,
)
from retcon_sandbox.plan.evidence import (
    FEATURES,
    features,
    layout_only,
    structure,
    timeline,
)
from retcon_sandbox.plan.facts import Change, Facts, MessyCommit
from retcon_sandbox.plan.messages import conventional, describe
from retcon_sandbox.plan.order import derive, order_groups
from tests.conftest import ROOT


def facts(changes: dict[str, str], commits: list[tuple[str, list[str]]],
          texts: dict[str, str] | None = None, base_texts: dict[str, str] | None = None,
          blobs: dict[str, tuple[str | None, str | None]] | None = None,
          log: tuple[str, ...] = ()) -> Facts:
    blobs = blobs or {}
    return Facts(tuple(Change(p, s, *blobs.get(p, (None, None))) for p, s in changes.items()),
                 tuple(MessyCommit(m, tuple(p)) for m, p in commits),
                 frozenset(p for p, s in changes.items() if s != "D"), texts or {},
                 base_texts or {}, log)


def groups_of(f: Facts) -> list[list[str]]:
    return [list(g.paths) for g in draft(f).groups]


# --- the timeline ------------------------------------------------------------------------------


def test_a_sweeping_commit_and_a_formatter_run_do_not_count_a_fixup_counts_as_its_target() -> None:
    changes = {f"pkg/m{i}.py": "M" for i in range(8)}
    f = facts(changes, [("add parsing", ["pkg/m0.py", "pkg/m1.py"]),
                        ("add output", ["pkg/m2.py", "pkg/m3.py"]),
                        ("tidy", list(changes)),
                        ("run black", ["pkg/m4.py", "pkg/m5.py", "pkg/m6.py"]),
                        ("fixup! add parsing", ["pkg/m0.py", "pkg/m7.py"])])
    commits = list(f.commits)
    commits[2] = replace(commits[2], layout=True)  # read_facts found only layout changed
    t = timeline(replace(f, commits=tuple(commits)))
    assert t.last["pkg/m0.py"] == 0 and t.last["pkg/m7.py"] == 0  # the fixup is commit 0's
    assert t.last["pkg/m2.py"] == 1
    assert t.last["pkg/m4.py"] == 2  # only sweeps touched it: done at the first
    assert t.units[:2] == [["pkg/m0.py", "pkg/m1.py", "pkg/m7.py"], ["pkg/m2.py", "pkg/m3.py"]]
    assert t.revisited == 0  # m0's fixup is its own commit again


def test_a_large_commit_that_changes_words_is_work_however_many_files_it_touches() -> None:
    changes = {f"pkg/m{i}.py": "M" for i in range(8)}
    f = facts(changes, [("add parsing", ["pkg/m0.py", "pkg/m1.py"]),
                        ("fix build", [f"pkg/m{i}.py" for i in range(1, 8)])])
    t = timeline(f)
    assert t.units == [["pkg/m0.py"], [f"pkg/m{i}.py" for i in range(1, 8)]]
    assert t.last["pkg/m1.py"] == 1 and t.revisited == 1


@pytest.mark.parametrize(("old", "new", "laid_out"), [
    ("def f(a,b):\n  return a+b\n", "def f(a, b):\n    return a + b\n", True),
    ("import os\nimport abc\n", "import abc\nimport os\n", True),  # sorted imports
    ("x = 'it is'\n", 'x = "it is"\n', True),
    ("x = 1\n", "x = 2\n", False),  # a number
    ("x = 'it is'\n", "x = 'it was'\n", False),  # a string's words
    ("f(a)\nf(a)\n", "f(a)\n", False),  # a word as often as before
    ("x = 1\n", "x = 1\n", False),  # no change
    ("d = a - b\n", "d = b - a\n", False),  # the same words, in another order
    ("x = 1\n", "x = -1\n", False),  # an operator
    ("if a < b:\n", "if a <= b:\n", False),
    ("f(a, b);\n", "f(\n  a,\n  b,\n)\n", True),  # commas, semicolons and brackets
])
def test_a_layout_change_keeps_every_word_as_often(old: str, new: str, laid_out: bool) -> None:
    assert layout_only(old, new) is laid_out


def test_files_finished_together_stay_together_and_a_wip_continues_the_work() -> None:
    f = facts({"shop/cart.py": "M", "shop/tax.py": "A", "tests/test_tax.py": "A",
               "docs/usage.md": "M", ".github/workflows/ci.yml": "M"},
              [("add tax rules", ["shop/tax.py", "shop/cart.py"]),
               ("wip", ["tests/test_tax.py", "shop/tax.py"]),
               ("Document the usage of the shop", ["docs/usage.md"]),
               ("Test on Python 3.13 in CI", [".github/workflows/ci.yml"])],
              texts={"tests/test_tax.py": "from shop.tax import rate\n"})
    t = timeline(f)
    assert t.revisited == 1
    groups = groups_of(f)
    assert ["shop/cart.py", "shop/tax.py", "tests/test_tax.py"] in groups
    assert groups[-1] == [".github/workflows/ci.yml"]


def test_files_dealt_out_at_random_are_grouped_by_structure() -> None:
    """No file changed twice, no subject that says anything, and the files committed together
    unrelated: the deal is ignored, and files go with their own kind."""
    changes = {".github/workflows/test.yml": "M", "docs/usage.md": "M", "src/app/cart.py": "M",
               ".github/workflows/lint.yml": "M", "docs/install.md": "M", "src/app/tax.py": "M"}
    f = facts(changes, [("wip", [".github/workflows/test.yml", "docs/usage.md"]),
                        ("more", ["src/app/cart.py", ".github/workflows/lint.yml"]),
                        ("stuff", ["docs/install.md", "src/app/tax.py"])])
    t = timeline(f)
    assert t.revisited == 0
    assert not ordered_history(f, t, Scores(structure(f), f.paths))
    grouping = group_files(f)
    assert "structure" in grouping.how
    assert all(len({p.split("/")[0] for p in g}) == 1 for g in grouping.groups)  # never mixed
    assert ["docs/install.md", "docs/usage.md"] in map(sorted, grouping.groups)
    assert ["src/app/cart.py", "src/app/tax.py"] in map(sorted, grouping.groups)

def test_without_an_order_in_the_history_smaller_work_comes_first() -> None:
    """Files dealt out at random: the group whose files change the fewest lines comes first,
    whatever its role (a one-line doc fix before code, a rewritten CI workflow last)."""
    changes = {"docs/guide.md": "M", "src/app/cart.py": "M", "src/app/tax.py": "M",
               ".github/workflows/test.yml": "M"}
    texts = {"docs/guide.md": "Install with pip.\n",
             "src/app/cart.py": "from app.tax import rate\nx = rate\n",
             "src/app/tax.py": "rate = 2\nlimit = 3\nfloor = 1\n",
             ".github/workflows/test.yml": "".join(f"step {i}\n" for i in range(40))}
    f = facts(changes, [("wip", ["src/app/tax.py", "docs/guide.md"]),
                        ("more", [".github/workflows/test.yml", "src/app/cart.py"])],
              texts=texts, base_texts=dict.fromkeys(changes, ""))
    grouping = group_files(f)
    assert grouping.timeline is None and grouping.how.endswith("; ordered smaller work first")
    order = [sorted(g.paths) for g in draft(f).groups]
    assert order == [["docs/guide.md"], ["src/app/cart.py", "src/app/tax.py"],
                     [".github/workflows/test.yml"]]


def test_top_level_folders_are_the_draft_when_the_pair_model_finds_them_likelier() -> None:
    """Each folder's files share names, but not enough for linking to join them on its own:
    it stops once the branch has few enough groups, leaving a folder in pieces. One commit per
    top-level folder explains the pair scores better, so it is the draft, and says so."""
    files = [f"{top}/m{i}.py" for top in ("alpha", "beta", "gamma") for i in range(4)]
    texts = {p: f"{p.split('/')[0]}_rate = {i}\n{p.split('/')[0]}_limit = 2\n"
             for i, p in enumerate(files)}
    dealt = files[:]
    random.Random(3).shuffle(dealt)
    f = facts(dict.fromkeys(files, "M"), [("wip", dealt[i:i + 2]) for i in range(0, 12, 2)],
              texts=texts)
    linked = link(f.paths, Scores(structure(f), f.paths), weights.LINK, 2, 5)
    assert len(linked) == 5  # a folder left in pieces
    grouping = group_files(f)
    assert "top-level folders" in grouping.how
    assert sorted(map(sorted, grouping.groups)) == [files[0:4], files[4:8], files[8:12]]


def test_a_module_and_its_test_share_a_name_an_import_and_identifiers() -> None:
    f = facts({"src/alpha.py": "M", "tests/test_alpha.py": "M", "docs/beta.md": "M"},
              [("wip", ["src/alpha.py", "tests/test_alpha.py", "docs/beta.md"])],
              texts={"src/alpha.py": "def alpha_rounding(x):\n    return round(x, 2)\n",
                     "tests/test_alpha.py": "from src.alpha import alpha_rounding\n"
                                            "assert alpha_rounding(1) == 1\n",
                     "docs/beta.md": "Beta parses lists.\n"})
    s = structure(f)
    named = dict(zip(FEATURES, features(s, "src/alpha.py", "tests/test_alpha.py"), strict=True))
    other = dict(zip(FEATURES, features(s, "src/alpha.py", "docs/beta.md"), strict=True))
    assert named["same name"] == named["import"] == 1.0 and named["code and test"] == 1.0
    assert named["shared identifiers"] > 0.5 and other["shared identifiers"] == 0.0


def test_a_rename_goes_together() -> None:
    f = facts({"lib/old.py": "D", "lib/new.py": "A", "lib/other.py": "A"},
              [("remove old", ["lib/old.py"]), ("other", ["lib/other.py"]),
               ("add new", ["lib/new.py"])],
              blobs={"lib/old.py": ("b1", None), "lib/new.py": (None, "b1"),
                     "lib/other.py": (None, "b2")})
    home = {p: i for i, g in enumerate(groups_of(f)) for p in g}
    assert home["lib/old.py"] == home["lib/new.py"]


def test_empty_files_are_never_taken_for_a_rename() -> None:
    empty = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    f = facts({"reports/__init__.py": "A", "reports/pdf.py": "A", "legacy/__init__.py": "D",
               "legacy/old.py": "D"},
              [("add PDF reports", ["reports/__init__.py", "reports/pdf.py"]),
               ("remove legacy package", ["legacy/__init__.py", "legacy/old.py"])],
              blobs={"reports/__init__.py": (None, empty), "legacy/__init__.py": (empty, None),
                     "reports/pdf.py": (None, "b1"), "legacy/old.py": ("b2", None)})
    assert groups_of(f) == [["reports/__init__.py", "reports/pdf.py"],
                            ["legacy/__init__.py", "legacy/old.py"]]


# --- order -------------------------------------------------------------------------------------


def test_a_deletion_never_comes_before_the_change_that_stops_using_it() -> None:
    f = facts({"core/gone.py": "D", "core/user.py": "M"},
              [("delete", ["core/gone.py"]), ("x", ["core/user.py"])],
              texts={"core/user.py": "import os\n"},
              base_texts={"core/user.py": "from core.gone import helper\n"})
    d = derive(f)
    assert d.stops["core/gone.py"] == {"core/user.py"}
    assert order_groups([["core/gone.py"], ["core/user.py"]], [0.0, 1.0], d) == \
        [["core/user.py"], ["core/gone.py"]]


def test_an_import_that_was_there_before_orders_nothing_a_new_need_does() -> None:
    """Modules of one package that import each other (as before) are no cycle to merge; a new
    import, or a use of a name the other's change defines, is an order to keep."""
    base = {"pkg/a.py": "from pkg.b import helper\nx = 1\n",
            "pkg/b.py": "from pkg.a import x\ndef helper():\n    return 1\n"}
    f = facts({"pkg/a.py": "M", "pkg/b.py": "M", "pkg/c.py": "M"},
              [("Tune a", ["pkg/a.py"]), ("Tune b", ["pkg/b.py"]), ("Tune c", ["pkg/c.py"])],
              texts={"pkg/a.py": "from pkg.b import helper\nx = 2\n",
                     "pkg/b.py": "from pkg.a import x\ndef helper():\n    return 2\n",
                     "pkg/c.py": "from pkg.a import x\ndef rounded(v):\n    return x\n"},
              base_texts={**base, "pkg/c.py": "def rounded(v):\n    return v\n"})
    d = derive(f)
    assert d.deps["pkg/a.py"] == d.deps["pkg/b.py"] == set()
    assert d.deps["pkg/c.py"] == {"pkg/a.py"}  # a new import
    assert len(order_groups([["pkg/a.py"], ["pkg/b.py"], ["pkg/c.py"]], [0.0, 1.0, 2.0], d)) == 3


@pytest.mark.parametrize(("init", "exports"), [
    ("from pkg.number import (\n    apnumber,\n    clamp,\n)\n", "from pkg.number import (\n"
     "    apnumber,\n)\n"),
    ("from pkg.number import apnumber, clamp\n", "from pkg.number import apnumber\n"),
    ("from pkg.number import apnumber\n__all__ = [\n    'apnumber',\n    'clamp',\n]\n",
     "from pkg.number import apnumber\n__all__ = [\n    'apnumber',\n]\n"),
])
def test_a_test_of_a_name_a_package_newly_exports_needs_the_export(init: str, exports: str
                                                                   ) -> None:
    """`pkg.clamp` is defined in number.py and exported by __init__.py: a test of it needs
    both, and __init__.py needs number.py, so the three go in one commit."""
    f = facts({"pkg/__init__.py": "M", "pkg/number.py": "M", "tests/test_number.py": "M"},
              [("wip", ["pkg/number.py", "tests/test_number.py"]), ("wip", ["pkg/__init__.py"])],
              texts={"pkg/__init__.py": init,
                     "pkg/number.py": "def apnumber(v):\n    return v\ndef clamp(v):\n"
                                      "    return v\n",
                     "tests/test_number.py": "import pkg\ndef test_clamp():\n"
                                             "    assert pkg.clamp(1) == 1\n"},
              base_texts={"pkg/__init__.py": exports,
                          "pkg/number.py": "def apnumber(v):\n    return v\n",
                          "tests/test_number.py": "import pkg\n"})
    d = derive(f)
    assert d.deps["tests/test_number.py"] >= {"pkg/__init__.py", "pkg/number.py"}
    assert order_groups([["pkg/number.py", "tests/test_number.py"], ["pkg/__init__.py"]],
                        [0.0, 1.0], d) == [["pkg/number.py", "tests/test_number.py",
                                            "pkg/__init__.py"]]


def test_a_name_passed_in_a_call_is_no_export_and_orders_nothing() -> None:
    """Two modules that import each other, each adding `data,` to a call: neither exports a
    new name, so their commits are not merged."""
    base = {"pkg/a.py": "from pkg import b\n", "pkg/b.py": "from pkg import a\n"}
    f = facts({"pkg/a.py": "M", "pkg/b.py": "M"},
              [("add a", ["pkg/a.py"]), ("add b", ["pkg/b.py"])],
              texts={"pkg/a.py": "from pkg import b\nprint(\n    data,\n)\n",
                     "pkg/b.py": "from pkg import a\nlog(\n    data,\n)\n"},
              base_texts=base)
    d = derive(f)
    assert d.deps == {"pkg/a.py": set(), "pkg/b.py": set()}
    assert order_groups([["pkg/a.py"], ["pkg/b.py"]], [0.0, 1.0], d) == [["pkg/a.py"],
                                                                         ["pkg/b.py"]]


def test_groups_that_need_each_other_are_merged() -> None:
    f = facts({"a.py": "A", "b.py": "A"}, [("a", ["a.py"]), ("b", ["b.py"])],
              texts={"a.py": "import b\n", "b.py": "import a\n"})
    assert order_groups([["a.py"], ["b.py"]], [0.0, 1.0], derive(f)) == [["a.py", "b.py"]]


def test_code_comes_after_the_changed_code_it_imports_whatever_the_messy_order() -> None:
    f = facts({"app/user.py": "A", "docs/guide.md": "M", "lib/base.py": "A"},
              [("Add the user model", ["app/user.py"]),
               ("Explain the models in the guide", ["docs/guide.md"]),
               ("Add the base model", ["lib/base.py"])],
              texts={"app/user.py": "from lib.base import B\n"})
    where = {p: i for i, g in enumerate(groups_of(f)) for p in g}
    assert where["lib/base.py"] <= where["app/user.py"]


def test_a_test_comes_after_its_module_by_name_and_after_its_fixtures() -> None:
    f = facts({"tests/test_cart.py": "A", "tests/conftest.py": "A", "shop/cart.py": "M"},
              [("Test the cart's totals", ["tests/test_cart.py"]),
               ("Add fixtures for the tests", ["tests/conftest.py"]),
               ("Round the cart's totals", ["shop/cart.py"])])
    d = derive(f)
    assert d.deps["tests/test_cart.py"] == {"shop/cart.py", "tests/conftest.py"}
    groups = groups_of(f)
    where = {p: i for i, g in enumerate(groups) for p in g}
    assert where["tests/test_cart.py"] >= max(where["shop/cart.py"],
                                              where["tests/conftest.py"])


def test_a_test_done_after_its_module_was_changed_keeps_the_history_order() -> None:
    """The module was changed before the test was done: the test's commit takes the module as
    the messy branch had it then (versions), so time, not the name, orders them."""
    f = facts({"tests/test_cart.py": "M", "shop/cart.py": "M"},
              [("Start rounding the cart's totals", ["shop/cart.py"]),
               ("Test the rounding of totals", ["tests/test_cart.py"]),
               ("Round totals half to even", ["shop/cart.py"])])
    t = timeline(f)
    assert derive(f, t.touched).deps["tests/test_cart.py"] == set()
    assert derive(f).deps["tests/test_cart.py"] == {"shop/cart.py"}


def test_a_module_finished_before_its_test_is_still_needed_by_it() -> None:
    """Done in one messy commit before the test, the module gets no earlier version: the
    test's commit must come after the module's (a branch whose files were dealt out)."""
    f = facts({"tests/test_cart.py": "M", "shop/cart.py": "M"},
              [("WIP", ["shop/cart.py"]), ("WIP", ["tests/test_cart.py"])])
    assert derive(f, timeline(f).touched).deps["tests/test_cart.py"] == {"shop/cart.py"}


def test_a_changed_test_joins_the_changed_module_it_is_named_for() -> None:
    """Apart, the prefix between them would run the old test on the new module. A new test
    stays where it was: it only needs to come after."""
    f = facts({"shop/cart.py": "M", "tests/test_cart.py": "M", "tests/test_new.py": "A",
               "shop/new.py": "M"}, [("WIP", ["shop/cart.py", "shop/new.py"]),
                                     ("WIP", ["tests/test_cart.py", "tests/test_new.py"])])
    grouping = Grouping([["shop/cart.py", "shop/new.py"],
                         ["tests/test_cart.py", "tests/test_new.py"]], [0.0, 1.0], "test")
    moved = with_their_tests(grouping, derive(f))
    assert moved.groups == [["shop/cart.py", "shop/new.py", "tests/test_cart.py"],
                            ["tests/test_new.py"]]
    assert moved.ranks == [0.0, 1.0]


# --- size and scale ----------------------------------------------------------------------------


def test_every_file_is_in_exactly_one_group_and_the_draft_is_deterministic() -> None:
    changes = {"a/x.py": "A", "a/y.py": "M", "b/z.rs": "D", "tests/test_x.py": "A",
               "docs/d.md": "A", "Cargo.toml": "M", "weird name.txt": "A"}
    commits = [("one", ["a/x.py", "b/z.rs"]), ("two", ["tests/test_x.py", "docs/d.md"]),
               ("three", ["Cargo.toml", "weird name.txt", "a/y.py"]), ("x", ["a/x.py"])]
    first, second = draft(facts(changes, commits)), draft(facts(changes, commits))
    assert sorted(p for g in first.groups for p in g.paths) == sorted(changes)
    assert first == second


SEEDED = """
from retcon_sandbox.plan.draft import draft
from retcon_sandbox.plan.evidence import timeline
from tests.plan.test_draft import facts
files = [f"pkg/m{i}.py" for i in range(8)]
f = facts(dict.fromkeys(files, "M"), [("Start the parser and the output", files),
                                      ("Finish the parser", files[:4]),
                                      ("Finish the output", files[4:])])
print(list(timeline(f).touched), draft(f))
"""


def test_the_draft_is_the_same_whatever_the_hash_seed() -> None:
    """Each run of `plan` is a new interpreter with its own string hashes: nothing in the draft
    may follow a set's order (the files shared by two commits once came out in one)."""
    drafts = {subprocess.run([sys.executable, "-c", SEEDED], cwd=ROOT, capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
                             ).stdout for seed in ("1", "2", "3", "4")}
    assert len(drafts) == 1 and "pkg/m7.py" in drafts.pop()


def test_a_branch_makes_a_sensible_number_of_commits_never_one_never_one_per_file() -> None:
    """200 files dealt out one by one with no evidence at all: about √200 commits."""
    files = [f"pkg{i % 7}/m{i}.py" for i in range(200)]
    f = facts(dict.fromkeys(files, "A"), [("wip", [p]) for p in files])
    n = len(draft(f).groups)
    assert 9 <= n <= 21


def test_a_large_branch_is_grouped_by_role_and_folder_and_says_so() -> None:
    rng = random.Random(1)
    files = [f"src/pkg{i % 20}/sub{i % 3}/mod{i}.py" for i in range(1600)] + \
        [f"tests/test_mod{i}.py" for i in range(300)] + [f"docs/d{i}.md" for i in range(100)]
    texts = {f"tests/test_mod{i}.py": f"from src.pkg{i % 20}.sub{i % 3}.mod{i} import x\n"
             for i in range(300)}
    commits = [(f"commit {c}", rng.sample(files, rng.randint(1, 30))) for c in range(150)]
    f = facts(dict.fromkeys(files, "A"), commits, texts=texts)
    assert len(files) > EVIDENCE_LIMIT
    drafted = draft(f)
    assert "by role and folder" in drafted.how
    assert 8 <= len(drafted.groups) <= 30
    assert sorted(p for g in drafted.groups for p in g.paths) == sorted(files)
    where = {p: i for i, g in enumerate(drafted.groups) for p in g.paths}
    d = derive(f)
    assert all(where[q] <= where[p] for p in files for q in d.deps[p])  # each prefix can build


# --- shared files ------------------------------------------------------------------------------


def test_a_file_two_pieces_of_work_changed_goes_in_the_last_and_is_reported() -> None:
    f = facts({"src/a.py": "M", "src/b.py": "M", "CHANGES.md": "M", "docs/a.md": "M",
               ".github/workflows/ci.yml": "M"},
              [("Speed up a's parser", ["src/a.py", "CHANGES.md", "docs/a.md"]),
               ("Test on Python 3.13 in CI", [".github/workflows/ci.yml"]),
               ("Teach b to stream its output", ["src/b.py", "CHANGES.md"])])
    drafted = draft(f)
    groups = [list(g.paths) for g in drafted.groups]
    home = {p: i for i, g in enumerate(groups) for p in g}
    assert home["CHANGES.md"] == home["src/b.py"] != home["src/a.py"]
    assert drafted.shared == {"CHANGES.md": (home["src/a.py"] + 1, home["src/b.py"] + 1)}


# --- messages ----------------------------------------------------------------------------------


def test_messages_come_from_a_describing_messy_commit_never_from_noise() -> None:
    f = facts({"shop/discounts.py": "A"},
              [("WIP discounts", ["shop/discounts.py"]), ("fix build", ["shop/discounts.py"]),
               ("more discount stuff", ["shop/discounts.py"])])
    assert [g.message for g in draft(f).groups] == ["Add shop/discounts.py"]
    f2 = facts({"shop/discounts.py": "A"},
               [("wip", ["shop/discounts.py"]), ("add discount codes", ["shop/discounts.py"])])
    assert [g.message for g in draft(f2).groups] == ["Add discount codes"]


def test_conventional_commits_when_the_log_uses_them() -> None:
    log = ("feat: cart", "fix(cart): rounding", "docs: readme", "Merge stuff")
    assert conventional(log)
    assert not conventional(("Add cart", "Fix rounding", "docs: readme"))
    f = facts({"src/a.py": "A", "README.md": "M"},
              [("a", ["src/a.py"]), ("Describe the new module a", ["README.md"])], log=log)
    messages = [g.message for g in draft(f).groups]
    assert messages == ["feat: add src/a.py", "docs: describe the new module a"]


def test_a_merge_subject_is_noise_and_a_conventional_subject_keeps_its_case() -> None:
    f = facts({"app/a.py": "A"}, [("Merge branch 'main' into feature", ["app/a.py"]),
                                  ("Merge pull request #12 from x/y", ["app/a.py"])])
    assert [g.message for g in draft(f).groups] == ["Add app/a.py"]
    f2 = facts({"app/mul.py": "A"}, [("feat: mul", ["app/mul.py"])])
    assert [g.message for g in draft(f2).groups] == ["feat: mul"]


def test_a_fixup_subject_says_what_its_target_says_never_fixup() -> None:
    f = facts({"app/a.py": "A"}, [("fixup! Merge branch '1.1.x' (wip)", ["app/a.py"])])
    assert [g.message for g in draft(f).groups] == ["Add app/a.py"]
    f2 = facts({"app/b.py": "M"}, [("squash! fixup! teach b to stream", ["app/b.py"])])
    assert [g.message for g in draft(f2).groups] == ["Teach b to stream"]
    f3 = facts({"app/c.py": "M"}, [("amend! feat(c): stream", ["app/c.py"])])
    assert [g.message for g in draft(f3).groups] == ["feat(c): stream"]


def test_a_long_messy_subject_is_shortened_and_kept_whole_in_the_body() -> None:
    told = ("Add the fr_FR translations. Incomplete regarding the numbers, because US and FR "
            "do not use the same scales")
    f = facts({"app/fr.po": "A"}, [(told, ["app/fr.po"])])
    subject, body = draft(f).groups[0].message.split("\n\n")
    assert subject == "Add the fr_FR translations"
    assert " ".join(body.split("\n")) == told and max(map(len, body.split("\n"))) <= 72
    words = "Stop templating in docstrings in the function builder since it gets copied anyway"
    f2 = facts({"app/fb.py": "M"}, [(words, ["app/fb.py"])])
    subject = draft(f2).groups[0].message.split("\n")[0]
    assert len(subject) <= 72 and subject.endswith("...") and words.startswith(subject[:-3])


def test_a_described_subject_fits_in_72_characters() -> None:
    deep = "src/humanize/locale/{}/LC_MESSAGES/humanize.po"
    changes = {deep.format(lang): "A" for lang in ("fr_FR", "ko_KR", "nl_NL")}
    changes |= {"src/humanize/number_formatting_helpers.py": "M", "README.md": "M"}
    f = facts(changes, [("wip", list(changes))])
    subjects = [g.message for g in draft(f).groups]
    assert all(len(s) <= 72 and "\n" not in s for s in subjects), subjects
    together = describe(list(changes), f, derive(f, None), False)
    assert together.startswith("Add 3 files in src/humanize/locale"), together  # not `humanize.po
    assert len(together) <= 72  # and 2 more`: which?


def test_two_commits_never_share_a_subject() -> None:
    """Files of one messy commit drafted apart: the second says what it changes."""
    f = facts({"shop/cart.py": "M", "docs/guide/usage.md": "M"},
              [("Teach the cart to round totals", ["shop/cart.py", "docs/guide/usage.md"])])
    grouping = Grouping([["shop/cart.py"], ["docs/guide/usage.md"]], [0.0, 1.0], "test")
    from retcon_sandbox.plan import draft as drafting

    drafted = drafting._messages(f, derive(f, None), grouping.groups)
    assert [g.message for g in drafted] == ["Teach the cart to round totals",
                                            "Update docs/guide/usage.md"]


@pytest.mark.parametrize(("told", "log", "message"), [
    ("strutils.singularize: add back the es case", (), "strutils.singularize: add back the es "
                                                       "case"),
    ("README: move the API reference up", (), "README: move the API reference up"),
    ("Refactor: simplify the parser's loop", ("feat: a", "fix: b", "docs: c"),
     "refactor: simplify the parser's loop"),
    ("Simplify the parser's loop", ("feat: a", "fix: b", "docs: c"),
     "refactor: simplify the parser's loop"),
    ("teach the parser to stream", (), "Teach the parser to stream"),
])
def test_a_subject_is_recased_only_where_its_first_word_is_a_plain_word(
        told: str, log: tuple[str, ...], message: str) -> None:
    f = facts({"app/parser.py": "M"}, [(told, ["app/parser.py"])], log=log)
    assert draft(f).groups[0].message == message


@pytest.mark.parametrize("text", ["\n" * 200_000 + "x", "export {a\n" * 50_000,
                                  "from a import (" * 30_000, "pub use " + "{" * 200_000,
                                  "pub\n" * 20_000, "export default\n" * 8_000,
                                  "async\n" * 15_000, "from " + "." * 15_000])
def test_what_a_change_defines_is_read_in_linear_time(text: str) -> None:
    """Untrusted file contents: a pattern that rescans the rest of the text at every line
    would take hours on a file of blank lines."""
    started = time.perf_counter()
    derive(facts({"a.py": "M"}, [("x", ["a.py"])], texts={"a.py": text},
                 base_texts={"a.py": ""}))
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("subject", ["a" + " " * 200_000 + "b", "a " + "(" * 200_000 + " b"])
def test_a_subject_is_read_in_linear_time(subject: str) -> None:
    started = time.perf_counter()
    draft(facts({"a.py": "M"}, [(subject, ["a.py"])]))
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize(("told", "subject"), [
    ("... and then rewrite the whole parser so that it accepts every dialect we know of today",
     "... and then rewrite the whole parser so that it accepts every..."),
    ("1. Add the parser. 2. Add the printer, which prints what the parser made of the input",
     "1. Add the parser. 2. Add the printer, which prints what the parser..."),
    ("feat: " + "x" * 80, "feat: " + "x" * 63 + "..."),
    ("add\tthe\tparser\t" * 6 + "xx", "Add " + "the parser add " * 4 + "the..."),
])
def test_a_shortened_subject_keeps_what_it_says(told: str, subject: str) -> None:
    """Never an empty or one-word subject from a first `sentence`; a conventional type is
    kept; a tab is a space (the spec would write it as two characters)."""
    message = draft(facts({"a.py": "M"}, [(told, ["a.py"])])).groups[0].message
    assert message.split("\n")[0] == subject and len(subject) <= 72


def test_files_of_one_name_in_deep_folders_get_numbered_subjects() -> None:
    deep = "src/{}/very/deeply/nested/package/folder/structure/for/the/module/__init__.py"
    f = facts({deep.format("alpha"): "M", deep.format("bravo"): "M"},
              [("wip", [deep.format("alpha")]), ("more", [deep.format("bravo")])])
    assert [g.message for g in draft(f).groups] == ["Update __init__.py",
                                                    "Update __init__.py (2)"]


def test_a_rename_is_never_named_from_a_name_to_the_same_name() -> None:
    old, new = "index.js", "source/index.js"
    changes = {old: "D", new: "A", **{f"lib/part_{n}/long_module_name_here.js": "M"
                                       for n in range(3)}}
    f = facts(changes, [("wip", list(changes))], blobs={old: ("abc1", None), new: (None, "abc1")})
    subject = describe(list(changes), f, derive(f, None), False)
    assert subject == "Rename index.js to source/index.js; update 3 files in lib"
