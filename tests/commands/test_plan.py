"""`retcon-sandbox plan` through the real command line, on real repositories (no model, no
Docker: the deterministic draft and --check)."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from retcon_sandbox.errors import EXIT_UNCOVERED
from tests.conftest import Demo, cli, cli_on_a_terminal, git
from tests.plan.fixtures import ALL, CALC, NOTES, Fixture


def plan_groups(spec: Path) -> list[list[str]]:
    doc = tomllib.loads(spec.read_text(encoding="utf-8"))
    return [list(c["paths"]) for c in doc["commit"]]


def test_plan_then_check_on_the_demo(demo: Demo) -> None:
    out = demo.path / "draft.toml"
    result = cli("plan", "--source", "feature", "-o", str(out), cwd=demo.path)
    assert result.code == 0, result.err
    assert "Draft written" in result.out
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Draft history spec for feature")
    doc = tomllib.loads(text)
    assert (doc["source"], doc["remote"], doc["cleaned"]) == ("feature", "main", "feature-clean")
    assert all(c["history"] == [] and c["message"] and c["hints"] for c in doc["commit"])
    assert len(doc["commit"]) >= 2  # how close to the gold plan: bench/plan.py, not a test
    check = cli("plan", "--check", str(out), cwd=demo.path)
    assert check.code == 0, check.out + check.err
    assert "exactly one commit" in check.out


@pytest.mark.parametrize("fixture", ALL[1:], ids=lambda f: f.name)
def test_every_changed_file_is_in_exactly_one_commit(fixture: Fixture, tmp_path: Path) -> None:
    repo = tmp_path / fixture.name
    fixture.create(repo)
    result = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=repo)
    assert result.code == 0, result.err
    placed = [p for group in plan_groups(repo / "spec.toml") for p in group]
    changed = git(repo, "diff", "--no-renames", "--name-only", "main", "feature").splitlines()
    assert sorted(placed) == sorted(changed)
    assert cli("plan", "--check", "spec.toml", cwd=repo).code == 0


def test_the_draft_names_what_the_pyproject_and_tox_ini_install(tmp_path: Path) -> None:
    """Read from the source branch's tree, in memory; written commented out (setup has
    network: the user opts in)."""
    repo = tmp_path / "notes"
    NOTES.create(repo)
    assert cli("plan", "--source", "feature", "-o", "spec.toml", cwd=repo).code == 0
    text = (repo / "spec.toml").read_text(encoding="utf-8")
    assert "\n# setup = \"pip install -e '.[tests]' pytest-timeout\"\n" in text  # tox's deps
    assert 'test = "PYTHONPATH=src python3 -m pytest' in text
    assert "setup" not in tomllib.loads(text)["sandbox"]


def test_without_output_the_spec_goes_to_stdout_and_the_rest_to_stderr(demo: Demo) -> None:
    demo.git("checkout", "-q", "feature")
    result = cli("plan", cwd=demo.path)  # source: the current branch; remote: main
    assert result.code == 0, result.err
    assert tomllib.loads(result.out)["source"] == "feature"
    assert "Planning feature onto main" in result.err


def test_json_events(demo: Demo) -> None:
    result = cli("plan", "--source", "feature", "--json", cwd=demo.path)
    events = [json.loads(line) for line in result.out.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "plan_start" and kinds[-1] == "plan_written"
    spec = tomllib.loads(events[-1]["spec"])
    assert kinds.count("plan_commit") == len(spec["commit"]) == events[-1]["commits"]
    assert spec["cleaned"] == "feature-clean"


def test_an_existing_output_is_kept_unless_forced(demo: Demo) -> None:
    out = demo.path / "mine.toml"
    out.write_text("# my own spec\n")
    result = cli("plan", "--source", "feature", "-o", str(out), cwd=demo.path)
    assert result.code == 1 and "--force" in result.err
    assert out.read_text() == "# my own spec\n"
    assert cli("plan", "--source", "feature", "-o", str(out), "--force", cwd=demo.path).code == 0
    assert out.read_text().startswith("# Draft")
    assert [p.name for p in demo.path.iterdir() if p.name.startswith(".mine")] == []


def test_the_remote_defaults_to_the_upstream_then_main_then_master(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    CALC.create(repo)
    git(repo, "branch", "-m", "main", "master")
    result = cli("plan", "--source", "feature", cwd=repo)
    assert result.code == 0, result.err
    assert tomllib.loads(result.out)["remote"] == "master"
    git(repo, "branch", "base", "master")
    git(repo, "branch", "--set-upstream-to=base", "feature")
    result = cli("plan", "--source", "feature", "--cleaned", "tidy", cwd=repo)
    doc = tomllib.loads(result.out)
    assert (doc["remote"], doc["cleaned"]) == ("base", "tidy")


@pytest.mark.parametrize("args, message", [
    (["--source", "nope"], "unknown revision 'nope'"),
    (["--source", "feature", "--remote", "feature"], "same commit"),
    (["--source", "main", "--remote", "orphan"], "share no history"),
    (["--source", "same", "--remote", "main"], "changes nothing"),
    (["--source", "feature", "--cleaned", "a..b"], "not a valid branch name"),
    (["--source", "feature", "--cleaned", "main"], "rewritten"),
])
def test_bad_input_is_an_error_and_nothing_is_written(demo: Demo, args: list[str],
                                                      message: str) -> None:
    empty = git(demo.path, "mktree")  # an orphan commit, and a branch with main's tree
    orphan = git(demo.path, "commit-tree", empty, "-m", "orphan")
    git(demo.path, "branch", "orphan", orphan)
    same = git(demo.path, "commit-tree", git(demo.path, "rev-parse", "main^{tree}"), "-p",
               "main", "-m", "nothing")
    git(demo.path, "branch", "same", same)
    out = demo.path / "out.toml"
    result = cli("plan", *args, "-o", str(out), "--json", cwd=demo.path)
    assert result.code in (1, 2), result.err
    assert message in result.err
    assert json.loads(result.out.splitlines()[-1])["event"] == "error"
    assert not out.exists()


def test_outside_a_repository_and_with_a_detached_head(demo: Demo, tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    result = cli("plan", cwd=nowhere)
    assert result.code == 1 and "no git repository here" in result.err
    demo.git("checkout", "-q", "--detach", "feature")
    result = cli("plan", cwd=demo.path)
    assert result.code == 2 and "--source" in result.err


def test_check_names_what_is_uncovered_or_covered_twice(demo: Demo) -> None:
    spec = demo.path / "partial.toml"
    spec.write_text('source = "feature"\nremote = "main"\ncleaned = "c"\n\n'
                    '[[commit]]\nmessage = "a"\npaths = ["shop", "README.md"]\n\n'
                    '[[commit]]\nmessage = "b"\npaths = ["shop/discounts.py"]\n')
    result = cli("plan", "--check", str(spec), cwd=demo.path)
    assert result.code == EXIT_UNCOVERED
    assert "shop/discounts.py: #1, #2" in result.out
    assert "tests/test_discounts.py" in result.out and "docs/discounts.md" in result.out
    result = cli("plan", "--check", str(spec), "--json", cwd=demo.path)
    event = json.loads(result.out)
    assert event["event"] == "plan_check" and not event["complete"]
    assert event["twice"] == {"shop/discounts.py": [1, 2]}
    spec.write_text(spec.read_text() + '\n[[commit]]\nmessage = "rest"\nhints = "the rest"\n')
    result = cli("plan", "--check", str(spec), "--json", cwd=demo.path)
    assert json.loads(result.out)["by_model"] == [3]


def test_check_with_hints_only_says_the_model_covers_them(demo: Demo) -> None:
    spec = demo.path / "hints.toml"
    spec.write_text('source = "feature"\nremote = "main"\ncleaned = "c"\n\n'
                    '[[commit]]\nmessage = "a"\nhints = "everything"\n')
    result = cli("plan", "--check", str(spec), cwd=demo.path)
    assert result.code == 0, result.out + result.err
    assert "left to the hints-only commits #1 (the model decides)" in result.out


def test_a_file_that_appears_while_planning_is_kept(tmp_path: Path) -> None:
    from retcon_sandbox.commands.plan import output_file
    from retcon_sandbox.errors import SpecError

    target = tmp_path / "spec.toml"
    output_file(target, False).write(b"first\n")
    assert target.read_bytes() == b"first\n" and oct(target.stat().st_mode)[-3:] == "644"
    with pytest.raises(SpecError, match="appeared while plan was working"):
        output_file(target, False).write(b"second\n")
    assert target.read_bytes() == b"first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]


ODD_NAMES = ["a[1].py", "a*.py", "q?.py", " lead.txt", "trail.txt ", "new\nline.py", "tab\t.md",
             "esc\x1b[31m.py", "x.py"]


def test_names_that_look_like_patterns_or_hold_controls_are_taken_exactly(tmp_path: Path
                                                                         ) -> None:
    from retcon_sandbox.repo.gitrepo import Repo

    repo = Repo.init(tmp_path / "r", "main")
    repo.commit_files("main", {"base.txt": "base\n"}, "Initial")
    repo.update_branch("feature", repo.resolve("main"), None, "branch")
    for i, name in enumerate(ODD_NAMES):
        repo.commit_files("feature", {name: f"{i}\n"}, f"add file number {i} here")
    result = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=tmp_path / "r")
    assert result.code == 0, result.err
    assert "\x1b" not in result.out and "\\e[31m" in result.out  # escaped on the terminal
    spec = tmp_path / "r" / "spec.toml"
    doc = tomllib.loads(spec.read_text(encoding="utf-8"))
    patterns = sorted(p for c in doc["commit"] for p in c["paths"])
    assert patterns == sorted(["a?1].py", "a[*].py", "q[?].py", "?lead.txt", "trail.txt?",
                               "new?line.py", "tab?.md", "esc??31m.py", "x.py"])
    assert all("\x1b" not in c["message"] for c in doc["commit"])
    check = cli("plan", "--check", str(spec), "--json", cwd=tmp_path / "r")
    event = json.loads(check.out)
    assert check.code == 0 and event["complete"] and not event["uncovered"], check.out


def test_the_remote_is_never_the_sources_own_copy_and_a_newer_main_wins(tmp_path: Path
                                                                       ) -> None:
    """A pushed feature tracks origin/feature: that is the branch itself, not what it merges
    into. A local main older than the origin/main the branch merged would make the
    teammates' commits part of the plan: origin/main shares more history, so it is chosen."""
    repo = tmp_path / "r"
    CALC.create(repo)
    git(repo, "update-ref", "refs/remotes/origin/feature", "feature~1")
    git(repo, "config", "branch.feature.remote", "origin")
    git(repo, "config", "branch.feature.merge", "refs/heads/feature")
    result = cli("plan", "--source", "feature", cwd=repo)
    assert result.code == 0, result.err
    assert tomllib.loads(result.out)["remote"] == "main"
    git(repo, "checkout", "-q", "-b", "teammate", "main")
    (repo / "team.txt").write_text("theirs\n")
    git(repo, "add", "team.txt")
    git(repo, "commit", "-q", "-m", "feat: a teammate's change")
    git(repo, "update-ref", "refs/remotes/origin/main", "teammate")
    git(repo, "checkout", "-q", "feature")
    git(repo, "merge", "-q", "--no-edit", "origin/main")
    git(repo, "checkout", "-q", "main")
    result = cli("plan", "--source", "feature", cwd=repo)
    assert result.code == 0, result.err
    doc = tomllib.loads(result.out)
    assert doc["remote"] == "origin/main"
    assert not any("team.txt" in c["paths"] for c in doc["commit"])


# --- -o FILE ----------------------------------------------------------------------------------


def special_files(tmp_path: Path) -> dict[str, Path]:
    """A symlink to a file of its own, a named pipe and a directory: none a spec file."""
    target = tmp_path / "target.toml"
    target.write_text("# the link's target\n")
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    return {"a symbolic link": link, "a named pipe": fifo, "a directory": folder}


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_an_output_that_is_not_a_regular_file_is_never_replaced(demo: Demo, tmp_path: Path,
                                                                 force: tuple[str, ...]) -> None:
    for kind, path in special_files(tmp_path).items():
        result = cli("plan", "--source", "feature", "-o", str(path), *force, cwd=demo.path)
        assert result.code == 1, (kind, result.out + result.err)
        assert f"is {kind}, not a regular file" in result.err or \
            (not force and "exists; plan does not overwrite it" in result.err), result.err
    assert (tmp_path / "link.toml").is_symlink()
    assert (tmp_path / "target.toml").read_text() == "# the link's target\n"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe.toml").st_mode)
    assert (tmp_path / "folder.toml").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_an_output_that_cannot_be_written_is_an_error_before_planning(demo: Demo,
                                                                      tmp_path: Path) -> None:
    long_name = tmp_path / ("s" * 300 + ".toml")
    result = cli("plan", "--source", "feature", "-o", str(long_name), cwd=demo.path)
    assert result.code == 1, result.out + result.err
    assert "cannot write" in result.err and "File name too long" in result.err
    assert "Nothing was written" in result.err and "internal error" not in result.err
    assert "plan_commit" not in result.out and "1. " not in result.out  # refused at once


def test_names_that_are_not_utf8_or_hold_bidi_controls_print_a_valid_spec(tmp_path: Path
                                                                          ) -> None:
    from retcon_sandbox.repo.gitrepo import Repo

    repo = Repo.init(tmp_path / "r", "main")
    repo.commit_files("main", {"base.txt": "base\n"}, "Initial")
    repo.update_branch("feature", repo.resolve("main"), None, "branch")
    names: dict[str, str | None] = {os.fsdecode(b"bad\xff.txt"): "c\n", "bidi\u202egnp.txt": "d\n"}
    repo.commit_files("feature", names, "more")
    printed = cli("plan", "--source", "feature", cwd=tmp_path / "r")
    assert printed.code == 0, printed.err
    assert "\u202e" not in printed.out and "\\u202e" in printed.out
    doc = tomllib.loads(printed.out)
    assert sorted(p for c in doc["commit"] for p in c["paths"]) == ["bad?.txt",
                                                                    "bidi\u202egnp.txt"]
    on_terminal = cli_on_a_terminal("plan", "--source", "feature", cwd=tmp_path / "r")
    assert on_terminal.code == 0 and "\u202e" not in on_terminal.out


def test_an_existing_cleaned_branch_is_named_with_what_execute_will_do(demo: Demo) -> None:
    """A new spec has no run that created the branch: execute refuses it unless
    --adopt-branch, and plan's warning says so (not that execute continues it)."""
    demo.git("branch", "feature-clean", "main")
    result = cli("plan", "--source", "feature", "-o", "draft.toml", cwd=demo.path)
    assert result.code == 0, result.err
    warning = " ".join(result.out.split())
    assert "execute will continue it" not in warning
    assert "the branch 'feature-clean' exists, and `execute` works only on a cleaned branch " \
        "that the spec's own runs created" in warning
    assert "git branch -D feature-clean" in warning and "--adopt-branch" in warning
    assert "Next: review it, then  retcon-sandbox execute draft.toml\nThe run saves each " \
        "step in the spec: after a stop" in result.out
    assert "the same\ncommand resumes where it stopped." in result.out
    refused = cli("execute", str(demo.path / "draft.toml"), "--sandbox", "local",
                  "--non-interactive", cwd=demo.path)
    assert refused.code == 1 and \
        "its reflog does not show a run of retcon-sandbox creating it" in refused.err
    assert "--adopt-branch" in refused.err


def shared_change_log(root: Path) -> Path:
    """Two pieces of work, each with its entry in CHANGES.md, and CI in between."""
    from retcon_sandbox.repo.gitrepo import Repo

    repo = Repo.init(root, "main")
    repo.commit_files("main", {"src/a.py": "A = 1\n", "src/b.py": "B = 1\n",
                               "CHANGES.md": "# Changes\n", ".ci.yml": "on: push\n"}, "Initial")
    repo.update_branch("feature", repo.resolve("main"), None, "branch")
    repo.commit_files("feature", {"src/a.py": "A = 2\n", "CHANGES.md": "# Changes\n- faster a\n"},
                      "Speed up the parser in module a")
    repo.commit_files("feature", {".ci.yml": "on: [push, pull_request]\n"},
                      "Run the checks on pull requests too")
    repo.commit_files("feature", {"src/b.py": "B = 2\n",
                                  "CHANGES.md": "# Changes\n- faster a\n- streaming b\n"},
                      "Teach module b to stream its output")
    return root


def test_a_file_two_commits_change_is_said_and_goes_whole_in_the_last(tmp_path: Path) -> None:
    root = shared_change_log(tmp_path / "r")
    result = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=root)
    assert result.code == 0, result.err
    doc = tomllib.loads((root / "spec.toml").read_text(encoding="utf-8"))
    home = {p: i + 1 for i, c in enumerate(doc["commit"]) for p in c["paths"]}
    first, last = home["src/a.py"], home["src/b.py"]
    assert first < last == home["CHANGES.md"]
    assert (f"Shared: CHANGES.md is changed by the work of #{first} and #{last}: it goes whole "
            f"in #{last}; #{first} takes it as its messy commits left it") in result.out
    first_messy = git(root, "rev-list", "--reverse", "main..feature").split()[0]
    assert doc["commit"][first - 1]["versions"] == {"CHANGES.md": first_messy}
    events = [json.loads(line) for line in cli("plan", "--source", "feature", "--json",
                                                 cwd=root).out.splitlines()]
    assert {"event": "plan_shared", "path": "CHANGES.md", "commits": [first, last]}.items() \
        <= next(e for e in events if e["event"] == "plan_shared").items()


@pytest.mark.slow
def test_a_shared_file_is_taken_as_the_earlier_work_left_it_then_whole(tmp_path: Path) -> None:
    """plan, then execute with no model: the earlier commit builds with the change log as its
    own work left it, the later takes it whole, and nothing is flagged as invented."""
    root = shared_change_log(tmp_path / "r")
    assert cli("plan", "--source", "feature", "-o", "spec.toml", cwd=root).code == 0
    result = cli("execute", "spec.toml", "--sandbox", "local", "--non-interactive", cwd=root)
    assert result.code == 0, result.out + result.err
    assert "Tree check: cleaned == source ✓" in result.out and "⚠" not in result.out
    made = git(root, "rev-list", "--reverse", "main..feature-clean").split()
    logs = [git(root, "show", f"{sha}:CHANGES.md") for sha in made]
    assert "- faster a" in logs[0] and "streaming b" not in logs[0]
    assert "streaming b" in logs[-1]


def test_a_version_from_outside_the_source_branch_is_refused_before_anything(tmp_path: Path
                                                                            ) -> None:
    root = shared_change_log(tmp_path / "r")
    assert cli("plan", "--source", "feature", "-o", "spec.toml", cwd=root).code == 0
    spec = root / "spec.toml"
    base = git(root, "rev-parse", "main")
    text = spec.read_text(encoding="utf-8")
    first_messy = git(root, "rev-list", "--reverse", "main..feature").split()[0]
    spec.write_text(text.replace(first_messy, base), encoding="utf-8")
    result = cli("execute", "spec.toml", "--sandbox", "local", "--non-interactive", cwd=root)
    assert result.code != 0
    assert f"{base[:12]} is not a commit of feature since its merge-base with main" in result.err
    assert git(root, "branch", "--list", "feature-clean") == ""
    assert spec.read_text(encoding="utf-8") == text.replace(first_messy, base)


def test_a_commit_that_only_lays_files_out_anew_does_not_regroup_them(tmp_path: Path) -> None:
    """`tidy` reformats files of both pieces of work: it says nothing of where they belong,
    whatever its subject, so each file stays with the work that changed its words."""
    from retcon_sandbox.repo.gitrepo import Repo

    repo = Repo.init(tmp_path / "r", "main")
    start: dict[str, str | None] = {"parse/a.py": "A=1\n", "parse/b.py": "B=1\n",
                                    "docs/c.md": "C=1\n", "docs/d.md": "D=1\n"}
    repo.commit_files("main", start, "Initial")
    repo.update_branch("feature", repo.resolve("main"), None, "branch")
    repo.commit_files("feature", {"parse/a.py": "A=2\n", "parse/b.py": "B=2\n"}, "Add parsing")
    repo.commit_files("feature", {"docs/c.md": "C=2\n", "docs/d.md": "D=2\n"}, "Add output")
    repo.commit_files("feature", {"parse/a.py": "A = 2\n", "parse/b.py": "B = 2\n",
                                  "docs/c.md": "C = 2\n"}, "tidy")
    result = cli("plan", "--source", "feature", "-o", "spec.toml", cwd=tmp_path / "r")
    assert result.code == 0, result.err
    assert plan_groups(tmp_path / "r" / "spec.toml") == [["parse/a.py", "parse/b.py"],
                                                         ["docs/c.md", "docs/d.md"]]
