"""`retcon-sandbox demo`: build a messy repository, reconstruct it, show before and after."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from retcon_sandbox.commands import execute
from retcon_sandbox.errors import EXIT_OK, UsageError
from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import JsonReporter

WIDTH = 44


def create(directory: Path, with_paths: bool, spec_text: str | None = None) -> Path:
    """The demo repository and its spec (the demo's own, unless given); returns the spec's
    path."""
    make_folder(directory)
    repo = Repo.init(directory, "main")
    repo.commit_files("main", dict(demo_project.BASE), "Initial shop: a cart and its tests")
    repo.update_branch("feature", repo.resolve("main"), None, "branch")
    for message, files in demo_project.MESSY:
        repo.commit_files("feature", files, message)
    repo.check_out("main")
    spec = directory / "history-spec.toml"
    spec.write_text(spec_text or demo_project.spec_text(with_paths), encoding="utf-8")
    return spec


def make_folder(directory: Path) -> None:
    """The demo's folder: new, or empty; anything else says what it is instead."""
    hint = "Give --directory a new or empty folder, in a place you can write."
    try:
        if directory.is_dir():
            if any(directory.iterdir()):
                raise UsageError(f"{directory} is not empty", hint)
        elif directory.exists() or directory.is_symlink():
            raise UsageError(f"{directory} exists and is not a folder", hint)
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only, not ours, a name too long
        raise UsageError(f"cannot make the demo's folder {directory}: {exc.strerror or exc}",
                         hint) from None


def side_by_side(repo: Repo) -> str:
    base = repo.merge_base(repo.resolve("feature"), repo.resolve("main"))
    left = [f"{sha[:7]} {subject}" for sha, subject in repo.log(base, "feature")]
    right = [f"{sha[:7]} {subject}" for sha, subject in repo.log(base, "feature-clean")]
    rows = [f"  {'Messy: feature':<{WIDTH}}  Clean: feature-clean",
            f"  {'-' * (WIDTH - 2):<{WIDTH}}  {'-' * (WIDTH - 2)}"]
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        rows.append(f"  {a[:WIDTH]:<{WIDTH}}  {b}".rstrip())
    return "\n".join(rows)


def json_summary(repo: Repo, target: Path, spec: Path, code: int) -> int:
    base = repo.merge_base(repo.resolve("feature"), repo.resolve("main"))
    same = repo.tree_of("feature") == repo.tree_of("feature-clean")
    JsonReporter().emit("demo", directory=str(target), spec=str(spec), tree_equal=same,
                        messy=[sha for sha, _ in repo.log(base, "feature")],
                        clean=[sha for sha, _ in repo.log(base, "feature-clean")])
    return code if code != EXIT_OK or same else 1


def temporary_folder() -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix="retcon-demo-"))
    except OSError as exc:
        raise UsageError(f"cannot make a folder for the demo in {tempfile.gettempdir()}: "
                         f"{exc.strerror or exc}", "Give --directory a new or empty folder, or "
                         "set TMPDIR to a place you can write.") from None


def run(args: argparse.Namespace) -> int:
    directory = Path(args.directory) if args.directory else None
    if directory is not None and os.path.islink(directory):  # never written through (outfile)
        raise UsageError(f"{directory} is a symbolic link; the demo never writes through one",
                         "Give --directory a new or empty folder, in a place you can write.")
    target = (directory or temporary_folder()).resolve()
    spec = create(target, with_paths=not args.llm)
    as_json = bool(getattr(args, "json", False))
    if not as_json:
        print(f"Demo repository: {target}")
        print(f"  main: the shop; feature: {len(demo_project.MESSY)} messy commits on top")
        print(f"  spec: {spec}\n")
    code = execute.execute(execute.ExecuteOptions(
        spec=spec, repo=target, model=args.model, base_url=args.base_url,
        model_timeout=args.model_timeout, temperature=args.temperature,
        max_tokens=args.max_tokens, seed=args.seed, sandbox=args.sandbox,
        engine=tuple(args.engine or ()), non_interactive=True,
        json=as_json))
    repo = Repo(target)
    if as_json:
        return json_summary(repo, target, spec, code)
    print("\n" + side_by_side(repo))
    same = repo.tree_of("feature") == repo.tree_of("feature-clean")
    print(f"\nTree check: feature-clean {'==' if same else '!='} feature "
          f"{'✓' if same else '✗'}")
    print(f"\nLook around:\n  cd {target}\n  git log --stat feature-clean\n"
          f"  retcon-sandbox status {spec.name}")
    return code if code != EXIT_OK or same else 1
