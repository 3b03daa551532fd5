"""Branches made from trees written out in full: a base on `main`, then one commit per tree on
`feature`, through one `git fast-import` (files, executables, symlinks and submodules, exactly
as given), and a spec that takes each commit's changed paths as one `paths` commit. The trees
are hand-written (a scenario) or generated from a seed (`generated`): random adds, deletes,
renames, mode changes and type changes, deterministic for a seed."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

FILE, EXECUTABLE, LINK, SUBMODULE = "100644", "100755", "120000", "160000"
Entry = tuple[str, str]  # (mode, the content, a symlink's target or a submodule's commit)
Tree = dict[str, Entry]
WHO = "Test Author <author@example.com> 1767225600 +0000"

SPEC_HEAD = """\
source = "feature"
remote = "main"
cleaned = "feature-clean"

[sandbox]
{sandbox}
"""


def _data(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return f"data {len(raw)}\n".encode() + raw + b"\n"


def _commit(ref: str, mark: int, parent: int | None, message: str, tree: Tree) -> bytes:
    out = f"commit {ref}\nmark :{mark}\ncommitter {WHO}\n".encode() + _data(message)
    if parent is not None:
        out += f"from :{parent}\n".encode()
    out += b"deleteall\n"
    for path, (mode, text) in sorted(tree.items()):
        name = path.encode("utf-8", "surrogateescape")
        if mode == SUBMODULE:
            out += f"M {mode} {text} ".encode() + name + b"\n"
        else:
            out += f"M {mode} inline ".encode() + name + b"\n" + _data(text)
    return out + b"\n"


def write_branch(root: Path, base: Tree, commits: list[Tree], sandbox: str,
                 tag: str | None = None) -> Path:
    """`main` holding `base` (tagged `tag`), `feature` one commit per tree over it, and
    root/history-spec.toml taking each commit's changed paths, in order: the spec's path.
    `expected` holds the trees the run makes (`cleaned`)."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    stream = _commit("refs/heads/main", 1, None, "base", base)
    if tag:
        stream += f"reset refs/tags/{tag}\nfrom :1\n\n".encode()
    for number, tree in enumerate(commits, 2):
        stream += _commit("refs/heads/feature", number, number - 1, f"wip {number - 1}", tree)
    made = cleaned(base, commits)
    for number, tree in enumerate(made, len(commits) + 2):
        parent = 1 if number == len(commits) + 2 else number - 1
        stream += _commit("refs/heads/expected", number, parent, "expected", tree)
    subprocess.run(["git", "-C", str(root), "fast-import", "--quiet"], input=stream, check=True)
    subprocess.run(["git", "-C", str(root), "reset", "-q", "--hard", "main"], check=True)
    spec = SPEC_HEAD.format(sandbox=sandbox)
    for number, changed in enumerate(changes(base, commits), 1):
        spec += f'\n[[commit]]\nmessage = "step {number}"\npaths = {json.dumps(changed)}\n'
    (root / "history-spec.toml").write_text(spec)
    return root / "history-spec.toml"


def changes(base: Tree, commits: list[Tree]) -> list[list[str]]:
    """The paths each commit changes that the branch changes in all (a spec's paths must name
    some; taking another is taking it as it was): a commit left with none has no entry."""
    final = commits[-1]
    found = [sorted(p for p in {*before, *after} if before.get(p) != after.get(p)
                    and base.get(p) != final.get(p))
             for before, after in zip([base, *commits], commits, strict=False)]
    return [paths for paths in found if paths]


def cleaned(base: Tree, commits: list[Tree]) -> list[Tree]:
    """The trees a run of the spec makes, one per commit that finds something to take: each
    takes what still differs from the source branch (the last tree) at or under its paths."""
    final, tree, made = commits[-1], dict(base), []
    for listed in changes(base, commits):
        taken = [p for p in {*tree, *final} if tree.get(p) != final.get(p)
                 and any(p == q or p.startswith(q + "/") for q in listed)]
        for path in taken:
            if path in final:
                tree[path] = final[path]
            else:
                del tree[path]
        if taken:
            made.append(dict(tree))
    return made


def trees(root: Path, branch: str) -> list[str]:
    """The trees of main and of each commit of `branch` over it, oldest first."""
    out = subprocess.run(["git", "-C", str(root), "log", "--reverse", "--format=%T",
                          f"main..{branch}"], check=True, capture_output=True, text=True).stdout
    base = subprocess.run(["git", "-C", str(root), "rev-parse", "main^{tree}"], check=True,
                          capture_output=True, text=True).stdout
    return [base.strip(), *out.split()]


# --- generated branches -----------------------------------------------------------------------

FOLDERS = ("", "a/", "a/b/", "c/")
NAMES = ("x", "y.txt", "z.py", "w")


def _fits(tree: Tree, path: str) -> bool:
    """Whether `path` can be added: no entry is a folder of it, and it is no entry's folder."""
    parts = path.split("/")
    folders = {"/".join(parts[:i]) for i in range(1, len(parts))}
    return path not in tree and not folders & tree.keys() and \
        not any(name.startswith(path + "/") for name in tree)


def _pick(rng: random.Random, tree: Tree, *modes: str) -> str | None:
    found = sorted(p for p, (mode, _) in tree.items() if mode in modes and p != "check.sh")
    return rng.choice(found) if found else None


def _new_path(rng: random.Random, tree: Tree) -> str | None:
    for _ in range(20):
        path = rng.choice(FOLDERS) + rng.choice(NAMES)
        if _fits(tree, path):
            return path
    return None


def _change(rng: random.Random, tree: Tree, step: int) -> None:
    """One random change of `tree`, in place (skipped when it does not apply)."""
    kind = rng.choice(("add", "add", "delete", "rename", "mode", "edit", "to_link",
                       "to_file", "file_to_folder", "folder_to_file", "submodule"))
    text = f"{kind} {step} {rng.random():.6f}\n"
    if kind in ("add", "submodule"):
        path = _new_path(rng, tree)
        if path is not None:
            tree[path] = (SUBMODULE, f"{rng.getrandbits(160):040x}") if kind == "submodule" \
                else (rng.choice((FILE, EXECUTABLE)), text)
    elif kind in ("delete", "rename"):
        path = _pick(rng, tree, FILE, EXECUTABLE, LINK, SUBMODULE)
        if path is not None:
            entry = tree.pop(path)
            target = _new_path(rng, tree) if kind == "rename" else None
            if target is not None:
                tree[target] = entry
    elif kind in ("mode", "edit", "to_link", "file_to_folder"):
        path = _pick(rng, tree, FILE, EXECUTABLE)
        if path is None:
            return
        mode, old = tree[path]
        if kind == "mode":
            tree[path] = (EXECUTABLE if mode == FILE else FILE, old)
        elif kind == "edit":
            tree[path] = (mode, text)
        elif kind == "to_link":
            tree[path] = (LINK, rng.choice(("x", "../a/x", "check.sh", "missing")))
        else:
            del tree[path]
            tree[f"{path}/inner.txt"] = (FILE, text)
    elif kind == "to_file":
        path = _pick(rng, tree, LINK)
        if path is not None:
            tree[path] = (FILE, text)
    else:  # folder_to_file
        folder = rng.choice(("a", "a/b", "c"))
        inside = [p for p in tree if p.startswith(folder + "/")]
        if inside and folder not in tree and _fits({p: e for p, e in tree.items()
                                                    if p not in inside}, folder):
            for p in inside:
                del tree[p]
            tree[folder] = (FILE, text)


def generated(seed: int, commits: int, check: str) -> tuple[Tree, list[Tree]]:
    """A base tree (`check` as check.sh, never changed) and `commits` trees after it, each
    a few random changes from the one before (at least one)."""
    rng = random.Random(seed)
    base: Tree = {"check.sh": (FILE, check)}
    for _ in range(5):
        path = _new_path(rng, base)
        if path is not None:
            base[path] = (rng.choice((FILE, FILE, EXECUTABLE)), f"base {rng.random():.6f}\n")
    out: list[Tree] = []
    tree = dict(base)
    for step in range(commits):
        before = dict(tree)
        while tree == before:
            for _ in range(rng.randint(2, 4)):
                _change(rng, tree, step)
        out.append(dict(tree))
    return base, out
