"""Provenance: every run names, per commit, the paths given content found in neither the base
nor the source; --strict-provenance stops at such a commit until a human resolves it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.repo.gitrepo import Repo, TreeEntry
from retcon_sandbox.repo.provenance import (
    BINARY,
    LARGE,
    LINE_CAP,
    MODE,
    NEW_FILE,
    PREFIX,
    SPECIAL,
    Invented,
    Provenance,
    Reader,
    classify,
    gate,
    invented,
    judge,
    of_commits,
)
from tests.conftest import cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Step, call
from tests.scripts import reconstruction, write

LOCAL = ("--sandbox", "local", "--non-interactive")
A, B, C = TreeEntry("100644", "a" * 40), TreeEntry("100644", "b" * 40), TreeEntry("100644",
                                                                                    "c" * 40)
PWN = ".github/workflows/pwn.yml"


def blob_reader(blobs: dict[str, bytes]) -> Reader:
    def read(entry: TreeEntry | None) -> bytes | None:
        if entry is None:
            return b""
        data = blobs[entry.sha]
        return None if len(data) > LINE_CAP else data
    return read


SOURCE_APP = b"".join(b"line %d\n" % i for i in range(1, 40)).replace(b"line 5\n", b"five\n") \
    .replace(b"line 30\n", b"thirty\nthirty-one\n")
BASE_APP = b"".join(b"line %d\n" % i for i in range(1, 40))


def test_classify() -> None:
    base = {"kept": A, "changed": A, "removed": A}
    source = {"kept": A, "changed": B, "added": B}
    blobs = {A.sha: b"a\n", B.sha: b"b\n", C.sha: b"c\n"}
    found = classify([("changed", A, C), ("added", None, B), ("removed", A, None),
                      ("kept", A, A), ("planted", None, C), ("changed2", A, None)],
                     base, source, blob_reader(blobs))
    assert found.novel == ("changed", "planted") and found.foreign == ("planted",)
    assert found.found == (Invented("changed", 1, "c", ""), Invented("planted", 1, "c", NEW_FILE))


def test_invented_counts_lines_the_source_does_not_have() -> None:
    # some of the source's hunks, not others: moved lines only
    partial = BASE_APP.replace(b"line 30\n", b"thirty\nthirty-one\n")
    assert invented(partial, BASE_APP, SOURCE_APP) == (0, b"")
    assert invented(SOURCE_APP, partial, SOURCE_APP) == (0, b"")
    # lines moved within the file, the last newline dropped: still only the source's lines
    assert invented(b"line 2\nline 1", b"line 1\nline 2\n", b"") == (0, b"")
    planted = partial.replace(b"line 7\n", b"line 7\nimport os; os.system('x')\n")
    assert invented(planted, BASE_APP, SOURCE_APP) == (1, b"import os; os.system('x')")
    # a source line added more often than the source and the parent have it together
    twice = partial + b"five\nfive\n"
    assert invented(twice, BASE_APP, SOURCE_APP) == (1, b"five")
    # a changed line ending is a changed line
    assert invented(BASE_APP.replace(b"line 3\n", b"line 3\r\n"), BASE_APP, SOURCE_APP)[0] == 1


def test_what_is_compared_whole_is_flagged_whenever_it_differs() -> None:
    old, src, new = (TreeEntry("100644", c * 40) for c in "def")
    huge = TreeEntry("100644", "9" * 40)
    blobs = {old.sha: b"x\n", src.sha: b"x\ny\n", new.sha: b"x\n\xff\xfe\n",
             huge.sha: b"x\n" * (LINE_CAP // 2 + 1)}
    read = blob_reader(blobs)
    base, source = {"f": old}, {"f": src}
    assert judge("f", old, new, base, source, read) == Invented("f", why=BINARY)
    assert judge("f", old, huge, base, source, read) == Invented("f", why=LARGE)
    assert judge("f", huge, TreeEntry("100644", src.sha), base, source, read) is None
    link = TreeEntry("120000", old.sha)
    assert judge("f", old, link, base, source, read) == Invented("f", why=SPECIAL)
    executable = TreeEntry("100755", src.sha)
    assert judge("f", old, executable, base, source, read) == Invented("f", why=MODE)
    # a new file is flagged even when empty, or made of another file's source lines
    blobs["0" * 40] = b""
    empty = TreeEntry("100644", "0" * 40)
    assert judge("new.py", None, empty, base, source, read) == Invented("new.py", why=NEW_FILE)
    assert judge(PWN, None, src, base, source, read) == Invented(PWN, 2, "x", NEW_FILE)
    # and a deletion adds nothing
    assert judge("f", old, None, base, source, read) is None


def test_the_first_invented_line_is_sanitised() -> None:
    source = {"f": A}
    blobs = {A.sha: b"a\n", B.sha: b"a\n\x1b]0;owned\x07" + b"x" * 500 + b"\n"}
    found = classify([("f", A, B)], {"f": A}, source, blob_reader(blobs))
    assert found.found[0].lines == 1 and "\x1b" not in found.found[0].first
    assert found.found[0].first.startswith("\\e]0;owned\\x07") and len(found.found[0].first) == 120


def test_a_partly_applied_file_in_a_real_commit_flags_nothing(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path / "repo")
    base_sha = repo.commit_files("main", {"app.py": BASE_APP.decode()}, "base")
    source_sha = repo.commit_files("main", {"app.py": SOURCE_APP.decode(), "doc.md": "d\n"},
                                   "source")
    base_tree = repo.ls_tree(repo.tree_of(base_sha))
    source_tree = repo.ls_tree(repo.tree_of(source_sha))
    repo.update_branch("clean", base_sha, None, "test")
    partial = BASE_APP.replace(b"line 5\n", b"five\n")
    first = repo.commit_files("clean", {"app.py": partial.decode()}, "half")
    assert not of_commits(repo, [first], base_tree, source_tree)
    planted = repo.commit_files("clean", {"app.py": (partial + b"evil()\n").decode(),
                                          PWN: "on: push\n"}, "planted")
    found = of_commits(repo, [first, planted], base_tree, source_tree)
    assert found.novel == (PWN, "app.py") and found.foreign == (PWN,)
    assert found.found[1] == Invented("app.py", 1, "evil()", "")


def test_gate() -> None:
    found = Provenance(("x",), ())
    assert gate(found, strict=False, stuck=None, note=None) is None
    assert gate(Provenance(), strict=True, stuck=None, note=None) is None
    summary = gate(found, strict=True, stuck=None, note=None)
    assert summary is not None and summary.startswith(PREFIX) and "x" in summary
    assert gate(found, strict=True, stuck=summary, note=None) is not None
    assert gate(found, strict=True, stuck=summary, note="checked, fine") is None
    assert gate(found, strict=True, stuck="the build fails", note="fixed") is not None


def injected() -> list[Step]:
    """The reconstruction, but commit 1 plants a workflow that commit 4 removes again."""
    script = reconstruction()
    first, last = script[4], script[-1]
    assert isinstance(first, list) and isinstance(last, list)
    script[4] = [write(PWN, "on: push\n"), *first]
    script[-1] = [call("delete_file", path=PWN), *last]
    return script


@pytest.mark.slow
def test_a_planted_file_is_reported_though_the_trees_match(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    assert next(e for e in events if e["event"] == "tree_check")["equal"] is True
    origins = {o["number"]: o for o in next(e for e in events
                                            if e["event"] == "summary")["provenance"]}
    assert PWN in origins[1]["novel"] and origins[1]["foreign"] == [PWN]
    assert PWN not in origins.get(4, {"novel": []})["novel"]  # a deletion back to the base


@pytest.mark.slow
def test_the_human_summary_marks_it(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    line = next(x for x in result.out.splitlines() if "#1 " in x and "neither" in x)
    assert f"⚠ {PWN}" in line
    assert "check them before you push" in result.out


@pytest.mark.slow
def test_strict_provenance_stops_until_resolved(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()[:5]) as model:
        stopped = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                      env=llm_env(model.base_url))
    assert stopped.code == 3, stopped.out + stopped.err
    text = demo.spec.read_text()
    assert f'stuck = "{PREFIX} --strict-provenance' in text and PWN in text
    assert "complete" not in text.split("[[commit]]")[1]



def partly_applied() -> list[Step]:
    """The reconstruction, but commit 2 takes one of the two lines the README's new section
    has in the source (a hunk at a time); commit 4 writes the rest."""
    script = reconstruction()
    fix = script[7]
    assert isinstance(fix, list)
    section = demo_project.README.split("See docs/")[0]
    script[7] = [write("README.md", section), *fix]
    return script


@pytest.mark.slow
def test_a_partly_applied_file_is_not_flagged(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(partly_applied()) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    assert next(e for e in events if e["event"] == "tree_check")["equal"] is True
    readme = demo.git("show", "feature-clean~2:README.md")
    assert "## Discount codes" in readme and "See docs/" not in readme  # partly applied
    origins = next(e for e in events if e["event"] == "summary")["provenance"]
    assert [(o["number"], o["novel"]) for o in origins] == [(2, ["shop/discounts.py"])]
    assert origins[0]["invented"] == [{"path": "shop/discounts.py", "lines": 2,
                                       "first": "def discounted_total(cart, code=None:",
                                       "why": ""}]


@pytest.mark.slow
def test_an_invented_line_in_a_source_file_is_reported(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    script = partly_applied()
    first = script[4]
    assert isinstance(first, list)
    cart = demo_project.CART.replace("class Cart:\n", 'PLANTED = "by the model"\n\n\nclass Cart:\n')
    script[4] = [*first[:-1], write("shop/cart.py", cart), first[-1]]
    fix = script[7]
    assert isinstance(fix, list)
    script[7] = [write("shop/cart.py", demo_project.CART), *fix]  # gone before the tree check
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    line = next(x for x in result.out.splitlines() if "#1 " in x and "neither" in x)
    assert line.endswith("shop/cart.py (+1 line)"), line
    assert 'first invented line, shop/cart.py: PLANTED = "by the model"' in result.out
