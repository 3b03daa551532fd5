"""The workspace's git metadata, made by the supervisor from the tree's entries the host sends:
its HEAD holds exactly the tree (submodules, files a .gitignore names, line endings as they
are), its status is clean, and made again after the files changed in place it is the
repository a sandbox opened on the new tree has. (Through real sandboxes:
tests/docker/test_pipeline_fidelity.py.)"""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox.repo.gitrepo import Repo

supervisor = importlib.import_module("retcon_sandbox.sandbox.supervisor")

GITLINK = "1" * 40


def tree_of(repo: Repo, files: dict[str, str], links: dict[str, str],
            executable: tuple[str, ...] = ()) -> str:
    """A tree holding `files` (bytes as given: no filter), symlinks `links` (name -> target),
    a submodule at vendor/lib, and the modes asked for: written through plumbing (git's own,
    which knows either object format)."""
    def blob(data: str) -> str:
        return subprocess.run(["git", "-C", str(repo.root), "hash-object", "-w", "--no-filters",
                               "--stdin"], input=data.encode(), check=True,
                              capture_output=True).stdout.decode().strip()

    empty = blob("")
    records = [f"160000 {GITLINK if len(empty) == 40 else '1' * 64}\tvendor/lib\0"]
    for name, text in files.items():
        mode = "100755" if name in executable else "100644"
        records.append(f"{mode} {blob(text)}\t{name}\0")
    for name, target in links.items():
        records.append(f"120000 {blob(target)}\t{name}\0")
    index = repo.root / ".git" / "test-index"
    index.unlink(missing_ok=True)
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "-C", str(repo.root), "update-index", "-z", "--index-info"],
                   input="".join(records).encode(), env=env, check=True)
    return subprocess.run(["git", "-C", str(repo.root), "write-tree"], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def fill(workspace: Path, repo: Repo, tree: str) -> None:
    """The workspace as the helper fills it: files and symlinks, no folder for a submodule."""
    for name, entry in repo.ls_tree(tree).items():
        target = workspace / name
        if entry.mode == "160000":
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        data = subprocess.run(["git", "-C", str(repo.root), "cat-file", "blob", entry.sha],
                              check=True, capture_output=True).stdout
        if entry.mode == "120000":
            target.symlink_to(data.decode())
        else:
            target.write_bytes(data)
            target.chmod(0o775 if entry.mode == "100755" else 0o664)


def state(workspace: Path) -> dict[str, str]:
    """What a test that asks git sees."""
    asks = {"head": ("rev-parse", "HEAD", "HEAD^{tree}"),
            "status": ("status", "--porcelain", "--untracked-files=all", "--ignored"),
            "refs": ("for-each-ref", "--format=%(refname) %(objectname)"),
            "index": ("ls-files", "-s"),
            "log": ("log", "--format=%H %T %P %s"),
            "reflog": ("reflog", "--format=%H %gs"),
            "describe": ("describe", "--tags", "--long", "--always")}
    return {name: subprocess.run(["git", "-C", str(workspace), *args], check=True,
                                 capture_output=True, text=True).stdout
            for name, args in asks.items()}


def repository(tmp_path: Path) -> Repo:
    return Repo.init(tmp_path / "repo")


BASE = {"README.md": "# a\n", "src/app.py": "x = 1\n", "run.sh": "#!/bin/sh\n",
        ".gitignore": "*.log\n", "build.log": "tracked, though ignored\n",
        ".gitattributes": "* text=auto\n", "dos.txt": "one\r\ntwo\r\n", "old/gone.txt": "old\n"}


def test_the_head_holds_the_tree_exactly_and_the_status_is_clean(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    tree = tree_of(repo, BASE, {"link": "src/app.py"}, executable=("run.sh",))
    workspace = tmp_path / "workspace"
    fill(workspace, repo, tree)
    assert supervisor.make_git(str(workspace), None, 0, repo.tree_index(tree)) == 0
    seen = state(workspace)
    assert seen["head"].split()[1] == tree
    assert seen["status"] == ""  # the submodule's folder is there, empty, as in a checkout
    assert (workspace / "vendor" / "lib").is_dir() and not any((workspace / "vendor/lib").iterdir())
    assert f"160000 {GITLINK} 0\tvendor/lib" in seen["index"]


def test_made_again_after_a_change_in_place_it_is_a_fresh_sandboxs(tmp_path: Path) -> None:
    """A sandbox opened on the first tree whose files became the second tree's in place (a
    sandbox opened ahead), its git metadata made again, and one filled with the second tree:
    the same commits, refs, index, reflog and status."""
    repo = repository(tmp_path)
    first = tree_of(repo, BASE, {"link": "src/app.py"}, executable=("run.sh",))
    changed = {**BASE, "src/app.py": "x = 2\n", "new/b.txt": "b\n"}
    del changed["old/gone.txt"]
    second = tree_of(repo, changed, {"link": "README.md"}, executable=("src/app.py", "run.sh"))
    assert first != second
    reused, fresh = tmp_path / "reused", tmp_path / "fresh"
    fill(reused, repo, first)
    assert supervisor.make_git(str(reused), "v1.0", 2, repo.tree_index(first)) == 0
    for name in ("src/app.py", "link", "old/gone.txt"):
        (reused / name).unlink()
    (reused / "old").rmdir()
    fill(reused, repo, second)  # the changed files written over
    assert supervisor.make_git(str(reused), "v1.0", 3, repo.tree_index(second)) == 0
    fill(fresh, repo, second)
    assert supervisor.make_git(str(fresh), "v1.0", 3, repo.tree_index(second)) == 0
    assert state(reused) == state(fresh)
    assert state(fresh)["head"].split()[1] == second and state(fresh)["status"] == ""
    assert state(fresh)["describe"].startswith("v1.0-3-g")


def test_a_file_changed_since_the_tree_was_loaded_shows_as_modified(tmp_path: Path) -> None:
    """The HEAD is the tree under test; a file a command changed is the sandbox's, and the
    status says so (its blob, which only the host has, is not made up)."""
    repo = repository(tmp_path)
    tree = tree_of(repo, BASE, {"link": "src/app.py"})
    workspace = tmp_path / "workspace"
    fill(workspace, repo, tree)
    assert supervisor.make_git(str(workspace), None, 0, repo.tree_index(tree)) == 0
    (workspace / "src" / "app.py").write_text("x = 'changed by a build'\n")
    (workspace / "README.md").unlink()
    os.symlink("elsewhere", workspace / "dangling")
    assert supervisor.make_git(str(workspace), None, 0, repo.tree_index(tree)) == 0
    seen = state(workspace)
    assert seen["head"].split()[1] == tree
    assert seen["status"].splitlines() == [" D README.md", " M src/app.py", "?? dangling"]


def fsck(workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(workspace), "fsck", "--full", "--strict"],
                          capture_output=True, text=True)


LARGE = "".join(f"line {n} of a file larger than a block\n" for n in range(60_000))  # 2.3 MB


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_the_blobs_are_packed_and_git_verifies_every_one(tmp_path: Path,
                                                         object_format: str) -> None:
    """The tree's blobs go in a pack with its index, not loose (each file costs on
    fuse-overlayfs): git's own fsck finds the pack sound, and each blob has the file's bytes."""
    subprocess.run(["git", "init", "-q", f"--object-format={object_format}",
                    str(tmp_path / "repo")], check=True)
    repo = Repo(tmp_path / "repo")
    files = {**BASE, "big.txt": LARGE, "copy.md": BASE["README.md"], "empty": ""}
    tree = tree_of(repo, files, {"link": "src/app.py"}, executable=("run.sh",))
    workspace = tmp_path / "workspace"
    fill(workspace, repo, tree)
    assert supervisor.make_git(str(workspace), "v2", 3, repo.tree_index(tree)) == 0
    checked = fsck(workspace)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert state(workspace)["status"] == ""
    for name, text in {**files, "link": "src/app.py"}.items():
        shown = subprocess.run(["git", "-C", str(workspace), "cat-file", "blob",
                                f"HEAD:{name}"], check=True, capture_output=True).stdout
        assert shown == text.encode(), name
    objects = workspace / ".git" / "objects"
    loose = {p.parent.name + p.name for p in objects.glob("[0-9a-f][0-9a-f]/*")}
    blobs = {e.sha for e in repo.ls_tree(tree).values() if e.mode != "160000"}
    assert blobs and not blobs & loose
    assert len(list((objects / "pack").glob("pack-*.idx"))) >= 1


def test_a_pack_past_its_limit_is_followed_by_another(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Past PACK_LIMIT bytes (2 GiB, where an index's 4-byte offsets end) the next blob starts
    a pack of its own: here a limit of one byte, so one pack per blob, each sound."""
    monkeypatch.setattr(supervisor, "PACK_LIMIT", 1)
    repo = repository(tmp_path)
    tree = tree_of(repo, BASE, {"link": "src/app.py"})
    workspace = tmp_path / "workspace"
    fill(workspace, repo, tree)
    assert supervisor.make_git(str(workspace), None, 0, repo.tree_index(tree)) == 0
    checked = fsck(workspace)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    packs = list((workspace / ".git" / "objects" / "pack").glob("pack-*.idx"))
    assert len(packs) == len(BASE) + 1  # the files and the symlink, one blob each
    assert state(workspace)["status"] == ""
