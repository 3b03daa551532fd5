"""A sandbox holds what a checkout of its tree holds, also when the next commit's sandbox was
opened ahead (the pipeline) and a `paths` commit then changes it in place: a file's type changes
(symlink, file, folder), submodules are bumped or removed, and a deleted folder is gone.
(A submodule is a gitlink without content; the sandbox has no folder for it.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli, git

pytestmark = pytest.mark.slow  # whole runs of the command line

LOCAL = ("--sandbox", "local", "--non-interactive", "--no-cache", "--json")

# The test command: once `stage2` is there, the tree is the second commit's, as a checkout of it
# would be; before, it is the base's (the base check) or the first commit's.
CHECK = """\
set -e
if [ -e stage2 ]; then
  [ -f link ] && [ ! -L link ]          # a symlink became a file
  [ -L conf ]                           # a folder became a symlink
  [ -d linked ] && [ ! -L linked ]      # a symlink became a folder
  [ -f linked/x ]
  [ -d was_file ] && [ -f was_file/y ]  # a file became a folder
  [ ! -e legacy ]                       # a deleted folder is gone
  [ ! -e vendor/lib ]                   # a removed submodule is gone (`sub` is bumped)
else
  [ -L link ] && [ -d conf ] && [ -L linked ] && [ -f was_file ] && [ -d legacy ]
fi
"""

SPEC = """\
source = "feature"
remote = "main"
cleaned = "feature-clean"

[sandbox]
test = "sh check.sh"

[[commit]]
message = "one"
paths = ["one.txt"]

[[commit]]
message = "two"
paths = {paths}
"""

GITLINK_A = "1" * 40
GITLINK_B = "2" * 40


def gitlink(repo: Path, path: str, sha: str) -> None:
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{sha},{path}")


def make_repo(root: Path) -> Path:
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "check.sh").write_text(CHECK)
    (root / "target.txt").write_text("target\n")
    (root / "link").symlink_to("target.txt")
    (root / "conf").mkdir()
    (root / "conf" / "a.ini").write_text("a\n")
    (root / "real").mkdir()
    (root / "real" / "x").write_text("x\n")
    (root / "linked").symlink_to("real")
    (root / "was_file").write_text("file\n")
    (root / "legacy").mkdir()
    (root / "legacy" / "old.py").write_text("OLD = 1\n")
    git(root, "add", "-A")
    gitlink(root, "sub", GITLINK_A)
    gitlink(root, "vendor/lib", GITLINK_A)
    git(root, "commit", "-q", "-m", "base")
    git(root, "checkout", "-q", "-b", "feature")
    (root / "one.txt").write_text("one\n")
    git(root, "add", "one.txt")
    git(root, "commit", "-q", "-m", "wip: one")
    for path in ("link", "linked", "was_file"):
        (root / path).unlink()
    (root / "link").write_text("now a file\n")
    (root / "linked").mkdir()
    (root / "linked" / "x").write_text("x\n")
    (root / "was_file").mkdir()
    (root / "was_file" / "y").write_text("y\n")
    git(root, "rm", "-rq", "conf", "legacy")
    (root / "conf").symlink_to("real")
    (root / "stage2").write_text("two\n")
    git(root, "add", "-A")
    git(root, "update-index", "--force-remove", "vendor/lib")
    gitlink(root, "sub", GITLINK_B)
    git(root, "commit", "-q", "-m", "wip: types change")
    git(root, "checkout", "-q", "main")
    changed = git(root, "diff", "--name-only", "--no-renames", "feature~1", "feature").split()
    spec = root / "history-spec.toml"
    spec.write_text(SPEC.format(paths=json.dumps(sorted(changed))))
    return spec


@pytest.mark.parametrize("pipeline", ["--pipeline", "--no-pipeline"])
def test_a_sandbox_opened_ahead_takes_type_changes_and_submodules_as_a_checkout_would(
        tmp_path: Path, pipeline: str) -> None:
    spec = make_repo(tmp_path / "repo")
    result = cli("execute", str(spec), *LOCAL, pipeline)
    events = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    assert result.code == 0, result.out + result.err
    verdicts = [(e["number"], e["verdict"]) for e in events if e["event"] == "tests"]
    assert verdicts == [(1, "PASS"), (2, "PASS")], result.out
    repo = spec.parent
    assert git(repo, "rev-parse", "feature-clean^{tree}") == git(repo, "rev-parse",
                                                                 "feature^{tree}")
    assert "internal error" not in result.err


def test_a_folder_whose_files_are_deleted_in_a_sandbox_opened_ahead_is_gone(tmp_path: Path
                                                                              ) -> None:
    """Only plain deletions, so the open sandbox takes them in place: the folders they empty go
    too, as in a checkout (a test that the folder is gone passes)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "check.sh").write_text("set -e\n[ ! -e stage2 ] || { [ ! -e legacy ] && "
                                   "[ -f keep/kept.txt ] && [ ! -e keep/gone ]; }\n")
    for path in ("legacy/old.py", "legacy/deep/er/old.txt", "keep/kept.txt", "keep/gone/x"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("old\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(root, "checkout", "-q", "-b", "feature")
    (root / "one.txt").write_text("one\n")
    git(root, "add", "one.txt")
    git(root, "commit", "-q", "-m", "wip: one")
    git(root, "rm", "-rq", "legacy", "keep/gone")
    (root / "stage2").write_text("two\n")
    git(root, "add", "stage2")
    git(root, "commit", "-q", "-m", "wip: drop legacy")
    git(root, "checkout", "-q", "main")
    spec = root / "history-spec.toml"
    spec.write_text(SPEC.format(paths=json.dumps(["stage2", "legacy", "keep/gone"])))
    result = cli("execute", str(spec), *LOCAL, "--pipeline")
    assert result.code == 0, result.out + result.err
    events = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    assert [e["verdict"] for e in events if e["event"] == "tests"] == ["PASS", "PASS"]
